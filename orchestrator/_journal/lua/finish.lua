-- finish(head, entries; ARGV: now, fence, keep_ms) -> {'ok'} | {'fenced', why}
-- Finished and released. The keys get a TTL of the retention: Redis forgets them by itself even
-- if no sweep ever runs (the sweep decides by the journal's clock; the TTL is the backstop).
local t = now()
local h = head(KEYS[1])
local no = refused(h, tonumber(ARGV[2]), false)
if no then
    return no
end
if h.state ~= 'f' then
    redis.call('HSET', KEYS[1], 's', 'f', 'x', num(t))
end
redis.call('HDEL', KEYS[1], 'h', 'd', 'a', 'g')
redis.call('HSET', KEYS[1], 'u', num(t))
redis.call('PEXPIRE', KEYS[1], ARGV[3])
redis.call('PEXPIRE', KEYS[2], ARGV[3])
return {'ok'}
