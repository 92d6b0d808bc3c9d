-- A provider's token bucket, shared by every worker (worker/delivery/throttle.py).
--
-- KEYS[1]: the bucket. ARGV: rate (tokens a second), burst (tokens), tokens wanted, the fewest
-- worth granting, now in ms (negative: Redis's clock), hold in ms (0: none). Returns {tokens
-- granted, ms until the fewest worth granting are there}.
-- State: `tokens` (a float, as text) at `at` (ms), and `held` (ms): no token before it.
local rate, burst, want = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local least = math.min(tonumber(ARGV[4]), want, burst)
local now, hold = tonumber(ARGV[5]), tonumber(ARGV[6])
if now < 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local state = redis.call('HMGET', KEYS[1], 'tokens', 'at', 'held')
local tokens = tonumber(state[1]) or burst
local at = tonumber(state[2]) or now
local held = tonumber(state[3]) or 0
if now > at then
  tokens = math.min(burst, tokens + (now - at) * rate / 1000)
  at = now
end
if hold > 0 and now + hold > held then
  held = now + hold
  tokens = 0
end
local granted, wait = 0, 0
if now < held then
  wait = held - now
elseif tokens < least then
  wait = math.ceil((least - tokens) * 1000 / rate)
else
  granted = math.min(want, math.floor(tokens))
  tokens = tokens - granted
  if granted < want then
    wait = math.ceil((math.min(least, want - granted) - tokens) * 1000 / rate)
  end
end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'at', at, 'held', held)
redis.call('PEXPIRE', KEYS[1], math.max(held - now, 0) + math.ceil(burst * 1000 / rate) + 60000)
return {granted, wait}
