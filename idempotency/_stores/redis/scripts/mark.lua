-- mark(KEYS[1]: the store's mark, {prefix}meta; ARGV: offset_us, format, write) -> {format,
-- created_ms} as found, or as written when ARGV[3] is '1' and the key was free; false when
-- there is none and none was to be written (a read: looking creates nothing), or when the key
-- holds something else (another program's key under a prefix it shares: never touched).
-- Idempotent: a mark already there is never changed (idempotency._stores.mark).
local kind = redis.call('TYPE', KEYS[1])['ok']
if kind == 'hash' then
    local found = redis.call('HMGET', KEYS[1], 'format', 'created')
    if found[1] and found[2] then
        return found
    end
    return false
end
if kind ~= 'none' or ARGV[3] ~= '1' then
    return false
end
local created = int(math.floor(clock() / 1000))
redis.call('HSET', KEYS[1], 'format', ARGV[2], 'created', created)
return {ARGV[2], created}
