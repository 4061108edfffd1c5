-- release(KEYS[1]; ARGV: offset_us, token, orphan_retention_us)
-- Mirrors idempotency._transitions.release: a tombstone keeps fence and attempts monotonic.
-- Replies {'ok'}, {'lost'} or {'corrupt', why}.
local key, token, retention = KEYS[1], ARGV[2], tonumber(ARGV[3])
local now = clock()
local r, refused = load_held(key, token, now)
if refused then
    return refused
end
save(key, tombstone(r, now, retention), now)
announce(key, r)
return {'ok'}
