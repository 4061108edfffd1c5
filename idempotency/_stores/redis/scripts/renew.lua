-- renew(KEYS[1]; ARGV: offset_us, token, lease_us, orphan_retention_us)
-- Mirrors idempotency._stores.transitions.renew. Replies {'ok'}, {'lost'} or {'corrupt', why}.
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
return {'ok'}
