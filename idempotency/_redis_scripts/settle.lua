-- settle(KEYS[1]; ARGV: offset_us, has_result 1|0, retention_us, result)
-- Mirrors idempotency._transitions.settle: only an UNKNOWN record takes an operator's verdict.
-- Replies {'ok'}, {'lost'} or {'corrupt', why}.
local key, has_result, retention = KEYS[1], ARGV[2] == '1', tonumber(ARGV[3])
local now = clock()
local stored, why = load(key)
if why then
    return {'corrupt', why}
end
local r = live(stored, now)
if r == nil or r.state ~= UNKNOWN then
    return {'lost'}
end
if has_result then
    r.state = COMPLETED
    r.result = ARGV[4]
    r.updated = now
    r.completed = now
    r.expires = now + retention
else
    tombstone(r, now, retention)
end
save(key, r, now)
announce(key, r)
return {'ok'}
