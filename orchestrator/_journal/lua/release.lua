-- release(head, entries; ARGV: now, fence) -> 1 released, 0 the fence was stale (nothing changed)
local t = now()
if refused(head(KEYS[1]), tonumber(ARGV[2]), false) then
    return 0
end
redis.call('HDEL', KEYS[1], 'h', 'd', 'a', 'g')
redis.call('HSET', KEYS[1], 'u', num(t))
return 1
