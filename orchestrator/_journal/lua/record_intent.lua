-- record_intent(head, entries; ARGV: now, fence, position, at, identity)
--   -> {'ok', 'new' | 'again'} | {'conflict', stored value} | {'fenced', why} | {'finished'}
-- The same call at its position again changes nothing; another call there is refused.
local position, at, identity = ARGV[3], ARGV[4], ARGV[5]
local t = now()
local no = refused(head(KEYS[1]), tonumber(ARGV[2]), true)
if no then
    return no
end
local stored = redis.call('HGET', KEYS[2], position)
if stored then
    local bar = string.find(stored, '|', 2, true)
    if bar and string.sub(stored, bar + 1) == identity then
        return {'ok', 'again'}
    end
    return {'conflict', stored}
end
redis.call('HSET', KEYS[2], position, 'i' .. at .. '|' .. identity)
redis.call('HINCRBY', KEYS[1], 'n', 1)
redis.call('HINCRBY', KEYS[1], 'o', 1)
redis.call('HSET', KEYS[1], 'u', num(t))
return {'ok', 'new'}
