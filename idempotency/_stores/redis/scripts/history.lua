-- history(KEYS[1]; ARGV: offset_us) -> the record's history (lib.lua: record_event), false if
-- it has none.
return redis.call('GET', KEYS[1] .. ':h')
