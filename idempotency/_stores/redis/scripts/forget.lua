-- forget(KEYS[1]; ARGV: offset_us) -> 1 when the key was deleted, else 0, whatever it held
-- (a record in any state, or one that cannot be read): `RedisKeyStore.delete_all`. A history
-- beside it (a release before wrote one) and its fence memo (KEYS[1] .. ":h", ":f") go with it.
redis.pcall('UNLINK', KEYS[1] .. ':h', KEYS[1] .. ':f')
return redis.call('UNLINK', KEYS[1])
