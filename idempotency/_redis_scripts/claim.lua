-- claim(KEYS[1]; ARGV: offset_us, fingerprint, lease_us, takeover 1|0, orphan_retention_us, token)
-- Mirrors idempotency._transitions.claim. Replies:
--   {'claimed', token, fence, attempts, took_over 1|0}
--   {'replay', fence, attempts, completed_us, result}
--   {'busy', fence, retry_after_us}  {'mismatch'}  {'unknown', fence, attempts}  {'corrupt', why}
local key, fp, token = KEYS[1], ARGV[2], ARGV[6]
local lease, takeover, retention = tonumber(ARGV[3]), ARGV[4] == '1', tonumber(ARGV[5])
local now = clock()
local stored, why = load(key)
if why then
    return {'corrupt', why}
end
local r = live(stored, now)
if r == nil or r.state == RELEASED then
    local fence = (r and r.fence or 0) + 1
    local attempts = (r and r.attempts or 0) + 1
    save(key, {
        state = IN_PROGRESS, fence = fence, attempts = attempts, created = now, updated = now,
        lease = now + lease, completed = 0, expires = now + lease + retention,
        fp = fp, token = token, result = '',
    }, now)
    return {'claimed', token, fence, attempts, 0}
end
if r.fp ~= fp then
    return {'mismatch'}
end
if r.state == COMPLETED then
    return {'replay', r.fence, r.attempts, r.completed, r.result}
end
if r.state == UNKNOWN then
    return {'unknown', r.fence, r.attempts}
end
if now < r.lease then
    return {'busy', r.fence, r.lease - now}
end
if takeover then
    r.token = token
    r.fence = r.fence + 1
    r.attempts = r.attempts + 1
    r.updated = now
    r.lease = now + lease
    r.expires = now + lease + retention
    save(key, r, now)
    return {'claimed', token, r.fence, r.attempts, 1}
end
r.state = UNKNOWN
r.token = ''
r.updated = now
r.expires = 0
save(key, r, now)
announce(key, r)
return {'unknown', r.fence, r.attempts}
