-- A sending domain's warm-up day: the volume each mailbox provider got (worker/delivery/warmup.py).
--
-- KEYS[1]: the day's hash (group -> messages taken). ARGV[1]: seconds the hash is kept; then
-- for each group three values: the group, the messages wanted (negative: given back), the
-- day's volume. Returns, per group, {messages granted (or given back), taken that day after}.
local out = {}
for i = 2, #ARGV, 3 do
  local group, want, volume = ARGV[i], tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2])
  local used = tonumber(redis.call('HGET', KEYS[1], group) or '0')
  local granted
  if want < 0 then
    granted = -math.min(-want, used)
  else
    granted = math.max(0, math.min(want, volume - used))
  end
  if granted ~= 0 then
    used = redis.call('HINCRBY', KEYS[1], group, granted)
  end
  out[#out + 1] = {granted, used}
end
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[1]))
return out
