-- reconcile(KEYS[1]; ARGV: offset_us, fingerprint, fence, has_result 1|0, result, lease_us,
--           retention_us, orphan_retention_us, token)
-- Mirrors idempotency._stores.transitions.reconcile: the system of record's verdict on a record
-- still UNKNOWN under `fence`. Replies {'replay', fence, attempts, completed_us, result} (it
-- happened: completed with `result`), {'claimed', token, fence, attempts, 1} (it did not:
-- taken over, fence one higher), {'lost'} (another resolver acted first; nothing changed) or
-- {'corrupt', why}. Safe to re-send: a record already holding this verdict's own effect (this
-- result, or this claim's token) answers as the first try did.
local key, fp, fence, has_result = KEYS[1], ARGV[2], tonumber(ARGV[3]), ARGV[4] == '1'
local result, lease, retention = ARGV[5], tonumber(ARGV[6]), tonumber(ARGV[7])
local orphan_retention, token = tonumber(ARGV[8]), ARGV[9]
local now = clock()
local stored, why = load(key)
if why then
    return {'corrupt', why}
end
local r = live(stored, now)
if r == nil or r.fp ~= fp then
    return {'lost'}
end
if r.state == UNKNOWN and r.fence == fence then
    r.updated = now
    if has_result then
        r.state = COMPLETED
        r.result = result
        r.lease = 0 -- not delivered: a re-send of the lost attempt's caller gets this answer
        r.completed = now
        r.expires = now + retention
    else
        r.state = IN_PROGRESS
        r.token = token
        r.fence = r.fence + 1
        r.attempts = r.attempts + 1
        r.lease = now + lease
        r.expires = now + lease + orphan_retention
    end
    save(key, r, now)
    announce(key, r)
elseif not ((has_result and r.state == COMPLETED and r.result == result)
        or (not has_result and r.state == IN_PROGRESS and r.token == token)) then
    return {'lost'}
end
if r.state == COMPLETED then
    return {'replay', r.fence, r.attempts, r.completed, r.result}
end
return {'claimed', r.token, r.fence, r.attempts, 1}
