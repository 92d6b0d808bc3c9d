-- Token buckets shared by every worker (worker/delivery/throttle.py): a provider's, or a
-- dispatcher's for each mailbox provider. One call takes from one bucket or several (their keys
-- in one slot: a mailbox provider's buckets are tagged with their dispatcher's name).
--
-- KEYS: the buckets. ARGV[1]: now in ms (negative: Redis's clock); ARGV[2]: hold in ms (0:
-- none); then per bucket: rate (tokens a second), burst (tokens), tokens wanted, the fewest
-- worth granting. Returns per bucket {tokens granted, ms until the fewest worth granting are
-- there}.
-- State: `tokens` (a float, as text) at `at` (ms), and `held` (ms): no token before it.
local now, hold = tonumber(ARGV[1]), tonumber(ARGV[2])
if now < 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local out = {}
for k = 1, #KEYS do
  local base = 2 + (k - 1) * 4
  local rate, burst, want = tonumber(ARGV[base + 1]), tonumber(ARGV[base + 2]), tonumber(ARGV[base + 3])
  local least = math.min(tonumber(ARGV[base + 4]), want, burst)
  local state = redis.call('HMGET', KEYS[k], 'tokens', 'at', 'held')
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
  redis.call('HSET', KEYS[k], 'tokens', tostring(tokens), 'at', at, 'held', held)
  redis.call('PEXPIRE', KEYS[k], math.max(held - now, 0) + math.ceil(burst * 1000 / rate) + 60000)
  out[k] = {granted, wait}
end
return out
