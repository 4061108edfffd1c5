"""`RedisKeyStore` and everything only it needs: records shared by every process and host that
reach one Redis (one server, a Sentinel-managed primary, or a Redis Cluster).

- `store.py`: the store itself (transitions as scripts, re-sends, durability, cluster routing);
- `lua.py` and `scripts/*.lua`: the transition scripts, one per transition (shipped as package
  data, read once at import);
- the connection layer, bottom up: `wire.py` (one multiplexed connection's request/reply
  bookkeeping, free of I/O), `transport.py` (moving its bytes on asyncio or trio),
  `endpoint.py` (where to connect and how to introduce oneself, read from redis-py),
  `link.py` (a connection opened on first use and replaced when it dies);
- what rides on those connections: `waiters.py` (one shared subscriber connection for every
  waiting duplicate), `durable.py` (WAIT/WAITAOF group commit), `doubt.py` (writes whose outcome
  is unknown);
- the topologies: `sentinel.py` (finding the primary through Sentinel) and `cluster.py` (the slot
  map, MOVED/ASK).
"""
