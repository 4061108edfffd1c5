-- renew(KEYS[1]; ARGV: offset_us, token, lease_us)
-- Mirrors idempotency._stores.transitions.renew: the lease moves, the record keeps no expiry.
-- Replies {'ok'}, {'lost'} or {'corrupt', why}.
local key, token, lease = KEYS[1], ARGV[2], tonumber(ARGV[3])
local now = clock()
local r, refused = load_held(key, token, now)
if refused then
    return refused
end
r.updated = now
r.lease = now + lease
save(key, r, now)
return {'ok'}
