-- renew(KEYS[1]; ARGV: offset_us, token, lease_us, orphan_retention_us)
-- Mirrors idempotency._stores.transitions.renew; the record's history lives as long as it
-- plus the grace (lib.lua: keep_history). Replies {'ok'}, {'lost'} or {'corrupt', why}.
local key, token, lease, retention = KEYS[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local now = clock()
local r, refused = load_held(key, token, now)
if refused then
    return refused
end
r.updated = now
r.lease = now + lease
r.expires = now + lease + retention
save(key, r, now)
keep_history(key, r, now)
return {'ok'}
