-- purge(KEYS[1]; ARGV: offset_us) -> 1 when a logically expired record was deleted, else 0.
-- A record that cannot be read as ours is left for an operator, never deleted.
local now = clock()
local r, why = load(KEYS[1])
if why or r == nil or live(r, now) ~= nil then
    return 0
end
redis.call('DEL', KEYS[1])
return 1
