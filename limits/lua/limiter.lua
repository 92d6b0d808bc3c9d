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

-- A log's entries as two parallel arrays (members, scores), oldest first. One ZRANGE serves the
-- duplicate check, both counts and the retry time: a log holds at most a week of entries, and
-- one call that returns them costs Redis less than four that count them.
local function entries(key)
  local flat = redis.call('ZRANGE', key, 0, -1, 'WITHSCORES')
  local members, scores = {}, {}
  for k = 1, #flat, 2 do
    members[#members + 1] = flat[k]
    scores[#scores + 1] = tonumber(flat[k + 1])
  end
  return members, scores
end

-- How many scores lie in the window (start, +inf), and the index of the first of them.
local function window(scores, start)
  local first = #scores + 1
  for k = #scores, 1, -1 do
    if scores[k] > start then first = k else break end
  end
  return #scores - first + 1, first
end

-- When does a window of `span` ms have room for one more entry under `cap`? The entry that must
-- leave is the (count - cap + 1)-th oldest one inside the window.
local function frees_in(scores, first, count, cap, span, now)
  return scores[first + count - cap] + span - now
end

-- Returns reason, scope, retry for one user's four caps.
local function judge(caps, logs, now)
  for j = 1, 4 do
    if caps[j] == 0 then
      return 5, (j > 2) and 1 or 0, -1
    end
  end
  local best, best_retry = 0, -1
  for j = 1, 4 do
    local log = logs[j]
    if caps[j] > 0 and log.count >= caps[j] then
      local retry = frees_in(log.scores, log.first, log.count, caps[j], log.span, now)
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
  local day_start, week_start = now - DAY, now - WEEK
  local reply = {now}
  local n = #keys / 2
  for i = 1, n do
    local ck, ak = keys[2 * i - 1], keys[2 * i]
    local base = 4 + 5 * (i - 1)
    local mid = args[base]
    local caps = {tonumber(args[base + 1]), tonumber(args[base + 2]),
                  tonumber(args[base + 3]), tonumber(args[base + 4])}
    local cmembers, cscores = entries(ck)
    local cd, cdf = window(cscores, day_start)
    local cw, cwf = window(cscores, week_start)
    local seen = false
    for k = cwf, #cmembers do
      if cmembers[k] == mid then seen = true break end
    end
    if seen then
      -- Already holds a slot: the same answer again, not counted twice.
      reply[#reply + 1] = 2; reply[#reply + 1] = 0
      reply[#reply + 1] = cd; reply[#reply + 1] = cw; reply[#reply + 1] = -1
    else
      local _, ascores = entries(ak)
      local ad, adf = window(ascores, day_start)
      local aw, awf = window(ascores, week_start)
      local logs = {
        {scores = cscores, first = cdf, count = cd, span = DAY},
        {scores = cscores, first = cwf, count = cw, span = WEEK},
        {scores = ascores, first = adf, count = ad, span = DAY},
        {scores = ascores, first = awf, count = aw, span = WEEK},
      }
      local reason, scope, retry = judge(caps, logs, now)
      if reason == 1 then
        if not dry then
          -- Trim on every write, so a log never holds more than a week.
          if cwf > 1 then redis.call('ZREMRANGEBYSCORE', ck, '-inf', week_start) end
          if awf > 1 then redis.call('ZREMRANGEBYSCORE', ak, '-inf', week_start) end
          redis.call('ZADD', ck, now, mid)
          redis.call('ZADD', ak, now, channel .. ':' .. mid)
          redis.call('PEXPIRE', ck, TTL)
          redis.call('PEXPIRE', ak, TTL)
        end
        cd, cw = cd + 1, cw + 1
      end
      reply[#reply + 1] = reason; reply[#reply + 1] = scope
      if scope == 0 then
        reply[#reply + 1] = cd; reply[#reply + 1] = cw
      else
        reply[#reply + 1] = ad; reply[#reply + 1] = aw
      end
      reply[#reply + 1] = retry
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
    local _, scores = entries(keys[s + 1])
    local daily_cap, weekly_cap = tonumber(args[2 + 2 * s]), tonumber(args[3 + 2 * s])
    local d, df = window(scores, now - DAY)
    local w, wf = window(scores, now - WEEK)
    local retry = -1
    if daily_cap > 0 and d >= daily_cap then
      retry = frees_in(scores, df, d, daily_cap, DAY, now)
    end
    if weekly_cap > 0 and w >= weekly_cap then
      retry = math.max(retry, frees_in(scores, wf, w, weekly_cap, WEEK, now))
    end
    reply[#reply + 1] = d; reply[#reply + 1] = w; reply[#reply + 1] = retry
  end
  return reply
end

redis.register_function('gk_acquire', acquire)
redis.register_function('gk_release', release)
redis.register_function{function_name = 'gk_peek', callback = peek, flags = {'no-writes'}}
