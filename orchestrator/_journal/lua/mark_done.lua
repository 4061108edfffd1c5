-- mark_done(head, entries; ARGV: now, fence, position)
--   -> {'ok'} | {'missing'} | {'fenced', why} | {'finished'}
local position = ARGV[3]
local t = now()
local no = refused(head(KEYS[1]), tonumber(ARGV[2]), true)
if no then
    return no
end
local stored = redis.call('HGET', KEYS[2], position)
if not stored then
    return {'missing'}
end
if string.sub(stored, 1, 1) == 'd' then
    return {'ok'}
end
redis.call('HSET', KEYS[2], position, 'd' .. string.sub(stored, 2))
redis.call('HINCRBY', KEYS[1], 'o', -1)
redis.call('HSET', KEYS[1], 'u', num(t))
return {'ok'}
