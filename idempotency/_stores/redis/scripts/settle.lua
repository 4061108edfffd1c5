-- settle(KEYS[1]; ARGV: offset_us, has_result 1|0, retention_us, result, replacing, resent 1|0,
--        index, said, audit, mac)
-- Mirrors idempotency._stores.transitions.settle: only an UNKNOWN record takes an operator's
-- verdict; with replacing > 0 (an operator's earlier settle corrected), also the record
-- COMPLETED under exactly that fence.
-- Replies {'ok'}, {'lost'} or {'corrupt', why}.
-- resent = 1 only when this settle is sent again after its first reply was lost: then a record
-- already in the state it asked for (COMPLETED with this very result; or RELEASED, or gone,
-- for a failed verdict) is its own effect and answers ok.
local key, has_result, retention = KEYS[1], ARGV[2] == '1', tonumber(ARGV[3])
local replacing = tonumber(ARGV[5])
local now = clock()
local r, corrupt = load_live(key, now)
if corrupt then
    return corrupt
end
local again = r ~= nil and replacing > 0 and r.state == COMPLETED and r.fence == replacing
if (r == nil or r.state ~= UNKNOWN) and not again then
    local mine
    if has_result then
        mine = r ~= nil and r.state == COMPLETED and r.result == ARGV[4]
    else
        mine = r == nil or r.state == RELEASED
    end
    if ARGV[6] == '1' and mine then
        return {'ok'}
    end
    return {'lost'}
end
if has_result then
    r.state = COMPLETED
    r.result = ARGV[4]
    r.lease = 0 -- not delivered: the caller never had an answer, its re-send gets this one
    r.updated = now
    r.completed = now
    r.expires = now + retention
else
    tombstone(r, now, retention)
end
record_event(key, r, 'S', said(), now, false)
save(key, r, now)
announce(key, r)
return {'ok'}
