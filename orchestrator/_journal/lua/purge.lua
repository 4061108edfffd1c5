-- purge(head, entries; ARGV: now, force) -> {'gone'} | {'absent'} | {'busy', holder}
local t = now()
local h = head(KEYS[1])
if not h then
    redis.call('DEL', KEYS[2])
    return {'absent'}
end
if ARGV[2] ~= '1' and h.holder and h.deadline > t then
    return {'busy', h.holder}
end
redis.call('DEL', KEYS[1], KEYS[2])
return {'gone'}
