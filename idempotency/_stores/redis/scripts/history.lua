-- history(KEYS[1]; ARGV: offset_us) -> the record's history, false if it has none: inside the
-- record (format 3), else the key beside it a release before wrote (lib.lua: record_event).
local r = load(KEYS[1])
if r ~= nil and r.hist ~= nil then
    return r.hist
end
return redis.call('GET', KEYS[1] .. ':h')
