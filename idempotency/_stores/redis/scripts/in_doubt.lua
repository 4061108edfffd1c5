-- in_doubt(KEYS[1]; ARGV: offset_us, index, said, audit, mac (all but index unused)) -> as
-- read.lua, for a member of the in-doubt index (lib.lua: index): a record no longer in doubt, or
-- gone, leaves the index (in this script, so that no transition can put it back in between) and
-- reads as none. An unreadable one stays, and is reported as read.lua reports it.
local now = clock()
local r, why = load(KEYS[1])
if why then
    return {'corrupt', why}
end
if r == nil or not open(r.state) then
    redis.call('SREM', ARGV[#ARGV - 3], KEYS[1])
    return {'none', now}
end
return fields(r, now)
