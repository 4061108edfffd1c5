-- release(KEYS[1]; ARGV: offset_us, token, orphan_retention_us, resent 1|0, index, said, audit,
-- mac)
-- Mirrors idempotency._stores.transitions.release: a tombstone keeps fence and attempts monotonic.
-- Replies {'ok'}, {'lost'} or {'corrupt', why}.
-- resent = 1 only when this release is sent again after its first reply was lost: then a record
-- already RELEASED, or gone, is its own effect (either way the next claim runs) and answers ok.
local key, token, retention = KEYS[1], ARGV[2], tonumber(ARGV[3])
local now = clock()
local r, refused = load_held(key, token, now, ARGV[4] == '1', function(found)
    return found == nil or found.state == RELEASED
end)
if refused then
    return refused
end
tombstone(r, now, retention)
local told = said()
if string.sub(told, 1, 2) == 'a=' then -- a reconciliation's verdict first (rule 19)
    record_event(key, r, 'K', told, now, false)
    told = ''
end
record_event(key, r, 'R', told ~= '' and told or 'w=released', now, false)
save(key, r, now)
announce(key, r)
return {'ok'}
