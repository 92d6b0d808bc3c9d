-- A lease in Redis: one key holding its holder's token, with a TTL (gatekeeper/lib/leases.py,
-- RedisLease). Taking a free one is a plain SET NX PX; what must read the token before it
-- writes is here, in one script so that nobody's lease changes between the read and the write.
--
-- KEYS[1]: the lease. ARGV: what to do, the holder's token, the lease's length in ms.
--   renew    its full length again, when the token holds it
--   release  the key deleted, when the token holds it
--   hold     renewed when the token holds it, taken when nobody does (beat's leader)
-- Returns 1 when done, 0 when the lease is another's (or, for renew and release, nobody's).
local op, token = ARGV[1], ARGV[2]
if op ~= 'renew' and op ~= 'release' and op ~= 'hold' then
  return redis.error_reply('lease.lua: unknown operation ' .. tostring(op))
end
local held = redis.call('GET', KEYS[1])
if held == token then
  if op == 'release' then
    redis.call('DEL', KEYS[1])
  else
    redis.call('PEXPIRE', KEYS[1], ARGV[3])
  end
  return 1
end
if op == 'hold' and not held then
  redis.call('SET', KEYS[1], token, 'PX', ARGV[3])
  return 1
end
return 0
