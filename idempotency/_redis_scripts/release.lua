-- release(KEYS[1]; ARGV: offset_us, token, orphan_retention_us)
-- Mirrors idempotency._transitions.release: a tombstone keeps fence and attempts monotonic.
-- Replies {'ok'}, {'lost'} or {'corrupt', why}.
local key, token, retention = KEYS[1], ARGV[2], tonumber(ARGV[3])
local now = clock()
local stored, why = load(key)
if why then
    return {'corrupt', why}
end
local r = held(stored, token, now)
if r == nil then
    return {'lost'}
end
save(key, tombstone(r, now, retention), now)
announce(key, r)
return {'ok'}
