-- acquire(head, entries; ARGV: now, holder, lease) -> {'ok', fence} | {'busy', holder, seconds left}
-- Mirrors orchestrator._journal.lease.acquired.
local holder, lease = ARGV[2], tonumber(ARGV[3])
local t = now()
local h = head(KEYS[1])
if not h then
    redis.call('HSET', KEYS[1], 's', 'r', 'f', '1', 'h', holder, 'd', num(t + lease), 'n', '0',
        'o', '0', 'c', num(t), 'u', num(t))
    return {'ok', 1}
end
if h.holder and h.holder ~= holder and h.deadline > t then
    return {'busy', h.holder, num(h.deadline - t)}
end
local fence = h.fence + 1
redis.call('HSET', KEYS[1], 'f', tostring(fence), 'h', holder, 'd', num(t + lease), 'u', num(t))
return {'ok', fence}
