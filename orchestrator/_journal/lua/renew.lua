-- renew(head, entries; ARGV: now, fence, lease) -> {'ok'} | {'fenced', why}
local t = now()
local no = refused(head(KEYS[1]), tonumber(ARGV[2]), false)
if no then
    return no
end
redis.call('HSET', KEYS[1], 'd', num(t + tonumber(ARGV[3])), 'u', num(t))
return {'ok'}
