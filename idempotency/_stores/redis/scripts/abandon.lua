-- abandon(KEYS[1]; ARGV: offset_us, fence)
-- Mirrors idempotency._stores.transitions.abandon: the answer of the COMPLETED record stored
-- under `fence` was not delivered (its caller gave up); its delivery mark is cleared, so that the
-- caller's re-send replays it. Replies {'ok'}, {'lost'} (not COMPLETED under that fence: replaced
-- by a later execution, or gone) or {'corrupt', why}. Safe to re-send: clearing it twice is once.
local key, fence = KEYS[1], tonumber(ARGV[2])
local now = clock()
local r, corrupt = load_live(key, now)
if corrupt then
    return corrupt
end
if r == nil or r.state ~= COMPLETED or r.fence ~= fence then
    return {'lost'}
end
if r.lease ~= 0 then
    r.lease = 0
    r.updated = now
    save(key, r, now)
end
return {'ok'}
