-- read(KEYS[1]; ARGV: offset_us) -> the stored record as fields, for get/list/wait.
-- Liveness is judged by the caller with idempotency._stores.transitions.visible against `now`.
-- Replies {'none', now}, {'corrupt', why} or lib.lua's `fields`.
local now = clock()
local r, why = load(KEYS[1])
if why then
    return {'corrupt', why}
end
if r == nil then
    return {'none', now}
end
return fields(r, now)
