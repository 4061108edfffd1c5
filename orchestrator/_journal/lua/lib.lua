-- Shared prelude of every journal script (prepended by redis.py; not run on its own).
--
-- One run is two keys sharing the hash tag {run id}, so every script touches one slot (Redis
-- Cluster) and runs atomically: KEYS[1] the head hash, KEYS[2] the entries hash.
--
--   head:    s state ('r' running, 'f' finished)   f fence   h holder (absent: released)
--            d lease deadline   n calls   o dangling intents   c created   u updated   x finished
--            a the holder's proof of life   g the fence that wrote it
--   entries: field = position, value = state ('i' or 'd') .. at .. '|' .. JSON [server, tool,
--            fingerprint, key] (the call's identity, compared byte for byte on a re-record)
--
-- Times are seconds: ARGV[1] when the client has a clock of its own, else the Redis clock (TIME),
-- which every host sees alike. Stored as strings with microseconds, never as Lua numbers
-- (which Redis would truncate to integers on the way out).

local function now()
    if ARGV[1] ~= '' then
        return tonumber(ARGV[1])
    end
    local t = redis.call('TIME')
    return tonumber(t[1]) + tonumber(t[2]) / 1000000
end

local function num(x)
    return string.format('%.6f', x)
end

local function head(key)
    local v = redis.call('HMGET', key, 's', 'f', 'h', 'd')
    if not v[1] then
        return nil
    end
    return {state = v[1], fence = tonumber(v[2]), holder = v[3], deadline = tonumber(v[4] or '0')}
end

-- nil if `fence` holds the run (and, for a write, the run is not finished); else the refusal.
local function refused(h, fence, writing)
    if not h then
        return {'fenced', 'no such run'}
    end
    if h.fence ~= fence or not h.holder then
        return {'fenced', 'current fence ' .. tostring(h.fence) .. (h.holder and ', held' or ', released')}
    end
    if writing and h.state == 'f' then
        return {'finished'}
    end
    return nil
end
