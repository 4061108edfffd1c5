-- read(KEYS[1]; ARGV: offset_us) -> the stored record as fields, for get/list/wait.
-- Liveness is judged by the caller with idempotency._stores.transitions.visible against `now`.
-- Replies {'none', now}, {'corrupt', why} or
--   {'record', now, state, fence, attempts, created, updated, lease, completed, expires,
--    fingerprint, token, result, tool ('' when the record names none)}
local now = clock()
local r, why = load(KEYS[1])
if why then
    return {'corrupt', why}
end
if r == nil then
    return {'none', now}
end
return {'record', now, r.state, r.fence, r.attempts, r.created, r.updated, r.lease,
    r.completed, r.expires, r.fp, r.token, r.result, r.tool}
