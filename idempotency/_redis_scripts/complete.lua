-- complete(KEYS[1]; ARGV: offset_us, token, retention_us, result)
-- Mirrors idempotency._transitions.complete. Replies {'ok'}, {'lost'} or {'corrupt', why}.
local key, token, retention = KEYS[1], ARGV[2], tonumber(ARGV[3])
local now = clock()
local r, refused = load_held(key, token, now)
if refused then
    return refused
end
r.state = COMPLETED
r.token = ''
r.result = ARGV[4]
r.updated = now
r.lease = 0
r.completed = now
r.expires = now + retention
save(key, r, now)
announce(key, r)
return {'ok'}
