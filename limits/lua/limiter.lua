#!lua name=gatekeeper_limiter
--[[
Gatekeeper's exact sliding-log limiter, as a Redis Functions library.

A library (not EVAL/EVALSHA) because it is persisted and replicated with the data: a failover
or a restart from an RDB/AOF keeps it, and a client that finds it missing (FUNCTION FLUSH, a
fresh node) loads it again and retries; a function that is not found runs nothing.

Logs: one sorted set per user and channel, `<prefix>{u:<id>}:<channel>`, and one per user for
every channel, `<prefix>{u:<id>}:all`. Members are message ids (the `all` log prefixes them
with "<channel>:"), scores are times in milliseconds. The hash tag keeps a user's logs in one
cluster slot.

Windows end now and are open at their start: an entry is in the daily window when
score > now - 86400000, in the weekly window when score > now - 604800000. An entry exactly
24 h old has left the daily window.

Caps: -1 means no cap; 0 means blocked; n > 0 means at most n entries in the window.

gk_acquire  (one call decides many users: on a single node any users, on a cluster the users
            of one slot, since Redis Cluster requires a call's declared keys to share a slot)
  KEYS  2 per request: KEYS[2i-1] the request's channel log, KEYS[2i] its `all` log
  ARGV[1]  now in ms since the epoch, or "" to use the server's TIME
  ARGV[2]  "1" for a dry run (decide, record nothing), "0" otherwise
  ARGV[3]  the channel name (prefix of members in the `all` log)
  ARGV[4 + 5(i-1) ...]  per request: message id, channel daily cap, channel weekly cap,
                        all daily cap, all weekly cap
  reply  { now_ms, then 5 integers per request:
           reason  1 allowed, 2 duplicate, 3 daily_cap, 4 weekly_cap, 5 blocked
           scope   0 the channel log, 1 the `all` log (which log the counts describe)
           daily   entries in that log's daily window (after recording)
           weekly  entries in that log's weekly window (after recording)
           retry   ms until the refusing caps have room; -1 when admitted or blocked }

gk_release
  KEYS  2 per request, as above
  ARGV[1]  the channel name; ARGV[1 + i] the message id of request i
  reply  one integer per request: 1 if the message was recorded and is now removed, else 0

gk_peek  (flags: no-writes)
  KEYS[1] the channel log, KEYS[2] the `all` log of one user
  ARGV[1]  now in ms or ""; ARGV[2..5] channel daily, channel weekly, all daily, all weekly caps
  reply  { now_ms, then per log (channel, all): daily, weekly, ms until a slot frees or -1 }
--]]

local DAY = 86400000
local WEEK = 7 * DAY
-- Keys outlive the weekly window by a day so a quiet user's logs disappear on their own.
local TTL = WEEK + DAY

local function clock(arg)
  if arg ~= nil and arg ~= '' then
    return tonumber(arg)
  end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- When does the log have room for one more entry under `cap` in a window of `span` ms?
-- The entry that must leave is the (count - cap + 1)-th oldest one inside the window.
local function frees_in(key, count, cap, span, now)
  local oldest = redis.call('ZRANGEBYSCORE', key, '(' .. (now - span), '+inf',
                            'WITHSCORES', 'LIMIT', count - cap, 1)
  return tonumber(oldest[2]) + span - now
end

-- Returns reason, scope, retry for one user's four caps, given the counts.
local function judge(ck, ak, counts, caps, now)
  local spans = {DAY, WEEK, DAY, WEEK}
  local keys = {ck, ck, ak, ak}
  for j = 1, 4 do
    if caps[j] == 0 then
      return 5, (j > 2) and 1 or 0, -1
    end
  end
  local best, best_retry = 0, -1
  for j = 1, 4 do
    if caps[j] > 0 and counts[j] >= caps[j] then
      local retry = frees_in(keys[j], counts[j], caps[j], spans[j], now)
      if retry > best_retry then
        best, best_retry = j, retry
      end
    end
  end
  if best == 0 then
    return 1, 0, -1
  end
  -- j = 1, 3 are daily caps; 2, 4 weekly. Ties keep the first: channel before all, daily before weekly.
  local reason = (best % 2 == 1) and 3 or 4
  return reason, (best > 2) and 1 or 0, best_retry
end

local function acquire(keys, args)
  local now = clock(args[1])
  local dry = args[2] == '1'
  local channel = args[3]
  local day_start, week_start = '(' .. (now - DAY), '(' .. (now - WEEK)
  local reply = {now}
  local n = #keys / 2
  for i = 1, n do
    local ck, ak = keys[2 * i - 1], keys[2 * i]
    local base = 4 + 5 * (i - 1)
    local mid = args[base]
    local caps = {tonumber(args[base + 1]), tonumber(args[base + 2]),
                  tonumber(args[base + 3]), tonumber(args[base + 4])}
    if not dry then
      -- Trim on every write, so a log never holds more than a week.
      redis.call('ZREMRANGEBYSCORE', ck, '-inf', now - WEEK)
      redis.call('ZREMRANGEBYSCORE', ak, '-inf', now - WEEK)
    end
    local seen = redis.call('ZSCORE', ck, mid)
    local cd = redis.call('ZCOUNT', ck, day_start, '+inf')
    local cw = redis.call('ZCOUNT', ck, week_start, '+inf')
    if seen and tonumber(seen) > now - WEEK then
      -- Already holds a slot: the same answer again, not counted twice.
      table.insert(reply, 2); table.insert(reply, 0)
      table.insert(reply, cd); table.insert(reply, cw); table.insert(reply, -1)
    else
      local ad = redis.call('ZCOUNT', ak, day_start, '+inf')
      local aw = redis.call('ZCOUNT', ak, week_start, '+inf')
      local counts = {cd, cw, ad, aw}
      local reason, scope, retry = judge(ck, ak, counts, caps, now)
      if reason == 1 then
        if not dry then
          redis.call('ZADD', ck, now, mid)
          redis.call('ZADD', ak, now, channel .. ':' .. mid)
          redis.call('PEXPIRE', ck, TTL)
          redis.call('PEXPIRE', ak, TTL)
        end
        cd, cw = cd + 1, cw + 1
      end
      table.insert(reply, reason); table.insert(reply, scope)
      if scope == 0 then
        table.insert(reply, cd); table.insert(reply, cw)
      else
        table.insert(reply, ad); table.insert(reply, aw)
      end
      table.insert(reply, retry)
    end
  end
  return reply
end

local function release(keys, args)
  local channel = args[1]
  local reply = {}
  for i = 1, #keys / 2 do
    local mid = args[1 + i]
    local removed = redis.call('ZREM', keys[2 * i - 1], mid)
    redis.call('ZREM', keys[2 * i], channel .. ':' .. mid)
    table.insert(reply, removed)
  end
  return reply
end

local function peek(keys, args)
  local now = clock(args[1])
  local reply = {now}
  for s = 0, 1 do
    local key = keys[s + 1]
    local daily_cap, weekly_cap = tonumber(args[2 + 2 * s]), tonumber(args[3 + 2 * s])
    local d = redis.call('ZCOUNT', key, '(' .. (now - DAY), '+inf')
    local w = redis.call('ZCOUNT', key, '(' .. (now - WEEK), '+inf')
    local retry = -1
    if daily_cap > 0 and d >= daily_cap then
      retry = frees_in(key, d, daily_cap, DAY, now)
    end
    if weekly_cap > 0 and w >= weekly_cap then
      retry = math.max(retry, frees_in(key, w, weekly_cap, WEEK, now))
    end
    table.insert(reply, d); table.insert(reply, w); table.insert(reply, retry)
  end
  return reply
end

redis.register_function('gk_acquire', acquire)
redis.register_function('gk_release', release)
redis.register_function{function_name = 'gk_peek', callback = peek, flags = {'no-writes'}}
