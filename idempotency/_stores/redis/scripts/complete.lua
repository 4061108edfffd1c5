-- complete(KEYS[1]; ARGV: offset_us, token, retention_us, result, resent 1|0, delivered 1|0,
--          index, said, audit, mac)
-- said: '', a reconciliation's details (a=ANSWER, and b=/r= when an operator asked), written
-- as a reconciled event first, and/or the upstream's replay (u=replayed, last), added to the
-- completed event. Values are percent-encoded, so "u=" can only start the u pair.
-- Mirrors idempotency._stores.transitions.complete. Replies {'ok'}, {'lost'} or {'corrupt', why}.
-- resent = 1 only when this complete is sent again after its first reply was lost: then a record
-- already COMPLETED with this very result is its own effect and answers {'ok'} (the result the
-- server layer stores carries its execution time, so another attempt's result never matches).
local key, token, retention, result = KEYS[1], ARGV[2], tonumber(ARGV[3]), ARGV[4]
local now = clock()
local r, refused = load_held(key, token, now, ARGV[5] == '1', function(found)
    return found ~= nil and found.state == COMPLETED and found.result == result
end)
if refused then
    return refused
end
r.state = COMPLETED
r.token = ''
r.result = result
r.updated = now
r.lease = ARGV[6] == '1' and DELIVERED or 0
r.completed = now
r.expires = now + retention
local upstream = string.match(said(), 'u=[^,]*')
local verdict = string.gsub(said(), ',?u=[^,]*$', '')
if verdict ~= '' then -- a reconciliation's verdict (a=happened, a=not_happened): rule 19
    record_event(key, r, 'K', verdict, now, false)
end
record_event(key, r, 'D', 's=' .. int(#result) .. (upstream and ',' .. upstream or ''), now, false)
save(key, r, now)
announce(key, r)
return {'ok'}
