-- acquire(head, entries; ARGV: now, holder, lease, alive, dead)
--   -> {'ok', fence} | {'busy', holder, seconds left, fence, alive}
-- Mirrors orchestrator._journal.lease.acquired. `alive`: the holder's proof of life ('' for
-- none), kept in 'a' with the fence that wrote it in 'g' (a holder written by an older release
-- leaves 'g' behind, so its stale proof is never reported). `dead`: the fence of a holder the
-- caller proved dead ('' for none), taken over while it still holds the run.
local holder, lease, alive, dead = ARGV[2], tonumber(ARGV[3]), ARGV[4], tonumber(ARGV[5])
local t = now()
local h = head(KEYS[1])
local function proved(fence)
    if alive == '' then
        redis.call('HDEL', KEYS[1], 'a', 'g')
    else
        redis.call('HSET', KEYS[1], 'a', alive, 'g', tostring(fence))
    end
end
if not h then
    redis.call('HSET', KEYS[1], 's', 'r', 'f', '1', 'h', holder, 'd', num(t + lease), 'n', '0',
        'o', '0', 'c', num(t), 'u', num(t))
    proved(1)
    return {'ok', 1}
end
if h.holder and h.holder ~= holder and h.deadline > t and h.fence ~= dead then
    local proof = redis.call('HMGET', KEYS[1], 'a', 'g')
    local theirs = ''
    if proof[1] and tonumber(proof[2]) == h.fence then
        theirs = proof[1]
    end
    return {'busy', h.holder, num(h.deadline - t), tostring(h.fence), theirs}
end
local fence = h.fence + 1
redis.call('HSET', KEYS[1], 'f', tostring(fence), 'h', holder, 'd', num(t + lease), 'u', num(t))
proved(fence)
return {'ok', fence}
