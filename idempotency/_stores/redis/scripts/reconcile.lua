-- reconcile(KEYS[1]; ARGV: offset_us, fingerprint, fence, lease_us, token, index, said, audit,
-- mac)
-- Mirrors idempotency._stores.transitions.reconcile: a record still UNKNOWN under `fence` is
-- claimed for its reconciliation (IN_PROGRESS under `token`, the fence one higher). Replies
-- {'claimed', token, fence, attempts, 1}, {'lost'} (anything else: another resolver acted
-- first, nothing changed) or {'corrupt', why}. Safe to re-send: a record already held under
-- this claim's own token answers as the first try did.
local key, fp, fence, token = KEYS[1], ARGV[2], tonumber(ARGV[3]), ARGV[5]
local lease = tonumber(ARGV[4])
local now = clock()
local r, corrupt = load_live(key, now)
if corrupt then
    return corrupt
end
if r == nil or r.fp ~= fp then
    return {'lost'}
end
if not (r.state == IN_PROGRESS and r.token == token) then
    if r.state ~= UNKNOWN or r.fence ~= fence then
        return {'lost'}
    end
    hand_over(key, r, token, lease, now)
end
return {'claimed', r.token, r.fence, r.attempts, 1}
