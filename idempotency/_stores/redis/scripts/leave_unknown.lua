-- leave_unknown(KEYS[1]; ARGV: offset_us, token, index, said, audit, mac)
-- Mirrors idempotency._stores.transitions.leave_unknown: a reconciler that claimed the record
-- (reconcile.lua) could not tell, so the record is UNKNOWN again, kept until resolved; or the
-- holder of a claim gave its execution up as unknown (the guard's OutcomeLost), said as w=why.
-- Replies {'ok'}, {'lost'} or {'corrupt', why}. Not flagged for re-sends: a lost reply reads as
-- lost, and the caller's answer (-32012) is the same either way.
local key, token = KEYS[1], ARGV[2]
local now = clock()
local r, refused = load_held(key, token, now, false, function(found)
    return false
end)
if refused then
    return refused
end
to_unknown(key, r, now, function(turned)
    local told = said()
    if string.sub(told, 1, 2) == 'a=' then -- a reconciler's verdict (rule 19)
        record_event(key, turned, 'K', told, now, false)
    elseif told ~= '' then -- its holder gave the execution up as unknown (w=why)
        record_event(key, turned, 'I', told, now, false)
    end
end)
announce(key, r)
return {'ok'}
