-- index(KEYS[1]; ARGV: offset_us, index, said, audit, mac (all but index unused)) -> 1 when the
-- record is in doubt (IN_PROGRESS or UNKNOWN) and so in the in-doubt index now, else 0: the
-- scan that builds the index the first time it is read (`RedisKeyStore.list_records`).
local r = load(KEYS[1])
if r ~= nil and open(r.state) then
    redis.call('SADD', ARGV[#ARGV - 3], KEYS[1])
    return 1
end
return 0
