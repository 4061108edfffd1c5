-- purge(KEYS[1]; ARGV: offset_us, index, said (unused), audit, mac) -> 1 when a logically
-- expired record was deleted, else 0. A record that cannot be read as ours is left for an
-- operator, never deleted; its fence memo (lib.lua: save) outlives it. An in-doubt record it
-- meets joins the in-doubt index, should it be missing there (written by the previous release).
local now = clock()
local r, why = load(KEYS[1])
if r ~= nil and open(r.state) and ARGV[#ARGV - 3] ~= '' then
    redis.call('SADD', ARGV[#ARGV - 3], KEYS[1])
end
if why or r == nil or live(r, now) ~= nil then
    return 0
end
redis.call('DEL', KEYS[1])
if ARGV[#ARGV - 1] ~= '-' then -- its history went with it (lib.lua); the stream, if kept, says so
    r.expires = now
    record_event(KEYS[1], r, 'G', '', now, false)
end
return 1
