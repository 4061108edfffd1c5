-- sweep(head, entries; ARGV: now, retention) -> {'swept'} | {'absent'} | {'kept'}
-- One run: forgotten if it finished at least `retention` seconds before now. Unfinished runs
-- are kept whatever their age (see orchestrator._journal.lease.swept).
local h = redis.call('HMGET', KEYS[1], 's', 'x')
if not h[1] then
    return {'absent'}
end
if h[1] == 'f' and h[2] and tonumber(h[2]) <= now() - tonumber(ARGV[2]) then
    redis.call('DEL', KEYS[1], KEYS[2])
    return {'swept'}
end
return {'kept'}
