#!lua name=gatekeeper_limiter
--[[
Gatekeeper's send log and cap rules, as a Redis Functions library.

A library (not EVAL/EVALSHA) because it is persisted and replicated with the data: a failover
or a restart from an RDB/AOF keeps it, and a client that finds it missing (FUNCTION FLUSH, a
fresh node) loads it again and retries; a function that is not found runs nothing. Each
release's library has names of its own (its version in them: `register`, below), so that two
releases' libraries stay loaded side by side while both run.

THE LOG. Each user's recorded sends, every channel together, are one binary string: one field
of a bucket hash that 256 users share, those whose ids differ only in the low byte, or of its
group's hash of 16 (WHERE, below). The caller names both: key `<prefix>{b:<id >> 8>}`, field the
low byte as one raw byte (the hash tag puts a bucket and its groups, so each user's whole log,
in one cluster slot). Integers are big-endian, unsigned:

  byte 1    format version (2; a log of format 1, the previous version's, is read as format 2
            with holder 0 and written back as format 2)
  byte 2    T: tag slots per entry (0..8), the same for every entry of this log
  byte 3    C: channel sections (1..255)
  C section headers: name length (1 byte), the channel's name, entries (2 bytes; 0 for the
            last section, whose entries run to the end of the string)
  then each section's entries, in header order; within a section, oldest first:
    time      6 bytes, ms since the epoch
    message   7 bytes, a hash of the message id (duplicates and release): the first 7 bytes of
              the 8 the callers pass
    campaign  4 bytes, a hash of the campaign (0: none)
    held      4 bytes: the priority (0..9) in the high 4 bits; in the low 28, the holder: the
              send job whose run recorded it, as the callers number it (0: none: the REST gate,
              or format 1)
    tags      T x 4 bytes, hashes of the send's tags (0: an empty slot)
Format 1 had the message's 8 bytes and the priority as one byte, no holder: 19 + 4T bytes.

An entry is W = 21 + 4T bytes: sorted times make a window's count a binary search, and fixed
widths let string.find look for a message, campaign or tag hash in C, its offset checked after.
The last section's count is left implicit so that the common write, a send newer than every
entry on the channel written last, is one append (rebuilding costs five times as much).

UNCOUNTED LOGS. A send job's transactional sends are recorded too, not to be counted but so
that their message ids are claimed like marketing ones: in a second log of the user's, same
format, field `~` and the low byte. No rule reads it; a duplicate is looked for in both. A
bucket holding any says so in its `expiry` ('u' after the time): only then are its users'
uncounted logs read by a call deciding counted sends.

WHERE. A user's two logs are together in its bucket or in its group's key (the bucket's name
and one hex digit, id >> 4 & 15), never in both. A function is given the home key; a user with
no log there is looked for in the other; a write goes where the logs are (to the home when
nowhere), and gk_decide moves them from a bucket into a group that is their home. Whoever
writes a group marks its bucket's `expiry` ('g', below) and keeps the bucket alive as long; a
bucket's groups are read only when it says so.

The field `expiry` of a bucket (or group) holds when its TTL ends (ms, the callers' clock), then
'u' if it holds uncounted logs, then 'g' if some of its users' logs are in their groups. A
write extends it (to two days past what the new entry needs) only when it would end before that,
so a key's TTL is set about every other day rather than on every write (a PEXPIRE costs twice an
HSET). A key whose users all stop receiving expires on its own; gk_sweep, called by a periodic
task, drops the users of a live key whose newest entry has left the retention.

RULES. Each request names a rule set: the rules that apply to it, resolved by the caller. A rule
is a 29-byte record, '>BBBI4I6I6I6c4':
  kind      1 every send, 2 sends carrying `tag`, 3 sends of the request's own campaign
  scope     0 the request's channel, 1 every channel
  calendar  0 rolling: the window is (now - a, now]; a slot frees when the entry that must leave
              is a ms old. 1 calendar: a, b, c are consecutive period starts (ms) in the user's
              zone, the caller's now in [a, b) give or take a minute; the window starts at b when
              now >= b, else at a; a slot frees at the period's end.
  limit     most entries the window may hold (the caller has applied a priority reserve)
  a, b, c   see calendar
  tag       the tag's hash (kind 2), else 4 zero bytes
A window counts every matching entry after its start, later ones too (a clock that stepped back
frees no slot early). A request is admitted when every rule of its set has room.

gk_acquire  (one call decides many requests; on a cluster the keys of one slot)
  KEYS     the buckets of the call, each once
  ARGV[1]  now in ms, or "" for the server's TIME
  ARGV[2]  "1" dry run (decide, record nothing), "0" record
  ARGV[3]  the channel
  ARGV[4]  the priority, 0..9
  ARGV[5]  retention in ms: entries this old are dropped when the log is written
  ARGV[6]  the payload, every binary part in one argument (last, so that redis-benchmark -x
           can pass it):
             the campaign's hash (4 bytes; zeros: none)
             tags (1 byte), their hashes (4 bytes each, distinct, non-zero; up to 8)
             rule sets (1 byte), each: its rules (1 byte), their records back to back
             then the requests to the end, 12 bytes each: key (2 bytes, its position in
             KEYS), field (1 byte), message hash (8 bytes), rule set (1 byte, 1-based);
             grouped by key (a key that comes again later costs one more HMGET)
  reply    { now, then one string of 20 bytes per request, '>BBI4I6I4I4':
             outcome  1 allowed, 2 duplicate (recorded before: not counted again), 3 refused
             rule     the deciding rule's position in its set (1-based), 0 for none
             used     that rule's count when it refused; for a duplicate, the entry's holder
             retry    1 + ms until every refusing rule has room (0: admitted, or never)
             day      the channel's entries in the last 24 h   } after recording
             week     the channel's entries in the last 7 days }

gk_decide  (gk_acquire, with the holder its entries get and the log they go to; gk_acquire is
           gk_decide for holder 0, counted: the interface before holders, kept for its callers)
  as gk_acquire, and
  ARGV[7]  the holder: the send job, numbered by the caller below 2^28 (0: none)
  ARGV[8]  "1": the sends are not counted (transactional): recorded in the uncounted log, no
           rule applies; "0": counted

gk_decide_each  (gk_decide, some of its requests dry runs: the control group's held-out users
           asked what they would have got, in the same call as the others)
  as gk_decide with ARGV[2] "0", and a request's rule set byte + 128 for a dry run (decided,
  recorded nothing); at most 127 rule sets.

gk_release
  KEYS     one per request; ARGV[1] the channel; then 2 per request: field, message hash
           (field `~` and the low byte: the uncounted log); or ARGV[1] the channel, ARGV[2] a
           holder (0: any), then the 2 per request: an entry of another holder stays
  reply    one integer per request: 1 if the entry was there and is now removed, else 0

gk_run  (a send job chunk's record: who runs it now, and how far each of its sends got)
  KEYS[1]  the record: 16 bytes, the run that holds it, then one byte per recipient of the
           chunk, by position: 0 not sent, 1 sending (handed to the provider), 2 sent
  ARGV[1]  the run (16 bytes); ARGV[2] the record's TTL in ms
  ARGV[3]  "take": the run takes the record over (made if missing)
           reply { 1 if the record was there before, else 0; the states before }
           "mark": the states in ARGV[4], 7 bytes per run of positions, '>I4HB': first
           position, how many, state; written only while the run holds the record
           reply 1, or 0 when another run has taken it over (nothing written)

gk_usage  (flags: no-writes; one user)
  KEYS[1]  the bucket; ARGV[1] now or ""; ARGV[2] field; ARGV[3] campaign hash (zero: for
           per-campaign rules, the campaign that used most); then pairs: channel, rule set
  reply    { now, then per rule of each pair, in order: used, retry (ms; -1: it has room or
             never will) }

gk_import  (the upgrade from the two-sorted-set logs, in the interface of the version that
           converted them: this version's processes call gk_restore; idempotent)
  KEYS[1]  the bucket; ARGV[1] now or ""; ARGV[2] retention ms; ARGV[3] field;
           then 3 per entry: channel, time ms, message hash
  reply    gk_restore's, for those entries with no campaign, priority 5 and no tags

gk_restore  (rebuild_logs: sends from the send ledger, after Redis lost its data; idempotent)
  KEYS[1]  the bucket; ARGV[1] now or ""; ARGV[2] retention ms;
           then 4 per entry, grouped by field: field, channel, time ms, and the entry's bytes
           after its time: message hash (8), campaign hash (4), priority (1), tag hashes (4 each)
  reply    the number of entries added (one already there, by channel and message, is not)

gk_sweep
  KEYS[1]  a bucket; ARGV[1] now or ""; ARGV[2] retention ms
  reply    { users dropped (their newest entry has left the retention), 1 if the bucket was
             deleted (nobody left in it), else 0 }
--]]

local VERSION = 2
local BASE = 21                       -- an entry's bytes before its tag slots
local MESSAGE_AT, CAMPAIGN_AT, HELD_AT = 6, 13, 17 -- offsets inside an entry
local PRIORITY_UNIT = 268435456       -- 2^28: the priority's place in `held`
local RULE = 29
local REQUEST = 12
local DAY, WEEK = 86400000, 604800000
local EXPIRY = 'expiry'
local EXPIRY_PADDING = '                                                                '
local NONE = '\0\0\0\0'

-- Every name this library registers ends in its release's version, '_' and ten hex digits of
-- the sha1 of this file, and so does its own (the first line): the loader puts them in
-- (limits/engine/transport.py, `FunctionLibrary`). Function names are global across a server's
-- libraries, so two releases' libraries that shared one could not both stay loaded. Callers
-- name functions as below; the transport adds the version.
local SUFFIX = ''

local function register(name, callback, flags)
  redis.register_function{function_name = name .. SUFFIX, callback = callback, flags = flags}
end

-- Bound on the first call: while a library loads, Redis lets it reach nothing but `redis`.
local bunpack, bpack, find, sub, byte, char, rep, concat, floor, sort, unpack_list, math_huge
local match
local FIELDS = {} -- byte -> the one-byte field
local UNCOUNTED = {} -- byte -> the field of the uncounted log
local HEX = {} -- 0..15 -> a group key's last character

local function bind()
  bunpack, bpack = struct.unpack, struct.pack
  find, sub, byte, char, rep = string.find, string.sub, string.byte, string.char, string.rep
  match = string.match
  concat, sort, unpack_list = table.concat, table.sort, unpack
  floor, math_huge = math.floor, math.huge
  for b = 0, 255 do FIELDS[b], UNCOUNTED[b] = char(b), '~' .. char(b) end
  for g = 0, 15 do HEX[g] = string.format('%x', g) end
end

local function clock(arg)
  if arg ~= nil and arg ~= '' then
    return tonumber(arg)
  end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + floor(tonumber(t[2]) / 1000)
end

--- Reading a log ----------------------------------------------------------------------------

-- A log is one flat table: [1] the string, [2] T, [3] W, [4] C, then per section three slots,
-- from 5: the channel's name, the position of its first entry in the string, its entries.
local EMPTY = {'', 0, BASE, 0}

-- A format-1 log as format 2: each entry's message hash cut to 7 bytes, its priority moved
-- into `held`, with holder 0.
local function upgraded(raw)
  local tags, count = byte(raw, 2, 3)
  local pos = 4
  for _ = 1, count do
    pos = pos + 3 + byte(raw, pos)
  end
  local W1 = 19 + 4 * tags
  local pieces = {char(VERSION), sub(raw, 2, pos - 1)}
  for at = pos, #raw, W1 do
    pieces[#pieces + 1] = sub(raw, at, at + 12) .. sub(raw, at + 14, at + 17)
    pieces[#pieces + 1] = bpack('>I4', byte(raw, at + 18) * PRIORITY_UNIT)
    if tags > 0 then pieces[#pieces + 1] = sub(raw, at + 19, at + W1 - 1) end
  end
  return concat(pieces)
end

local function parse(raw, channel)
  if not raw then
    return EMPTY
  end
  local version, tags, count, len = byte(raw, 1, 4)
  if version == 1 then
    raw = upgraded(raw)
  elseif version ~= VERSION then
    error('unknown log format ' .. tostring(version))
  end
  local W = BASE + 4 * tags
  if count == 1 then
    -- Most users get one channel: one constructor, no table growth.
    local off = 7 + len
    local name = channel
    if not channel or len ~= #channel or find(raw, channel, 5, true) ~= 5 then
      name = sub(raw, 5, 4 + len)
    end
    return {raw, tags, W, 1, name, off, (#raw + 1 - off) / W}
  end
  if count == 2 then
    -- Email and push: also one constructor.
    local len2 = byte(raw, 7 + len)
    local hi, lo = byte(raw, 5 + len, 6 + len)
    local first_n = hi * 256 + lo
    local off = 10 + len + len2
    local off2 = off + first_n * W
    -- [11]: where the first section's count sits in the string (a write patches it there).
    return {raw, tags, W, 2, sub(raw, 5, 4 + len), off, first_n,
            sub(raw, 8 + len, 7 + len + len2), off2, (#raw + 1 - off2) / W, 5 + len}
  end
  local log = {raw, tags, W, count}
  local pos = 4
  for s = 0, count - 1 do
    len = byte(raw, pos)
    local hi, lo = byte(raw, pos + 1 + len, pos + 2 + len)
    log[5 + 3 * s] = sub(raw, pos + 1, pos + len)
    log[7 + 3 * s] = hi * 256 + lo
    pos = pos + 3 + len
  end
  for s = 0, count - 1 do
    log[6 + 3 * s] = pos
    pos = pos + log[7 + 3 * s] * W
  end
  local last = 4 + 3 * count
  log[last] = (#raw + 1 - log[last - 1]) / W
  return log
end

-- The slot (5, 8, ...) of a channel's section, or nil.
local function section_of(log, channel)
  for slot = 5, 2 + 3 * log[4], 3 do
    if log[slot] == channel then
      return slot
    end
  end
  return nil
end

local function time_at(raw, off, W, i)
  return (bunpack('>I6', raw, off + i * W))
end

-- Index (0-based) of the first of a section's n entries with a time after `start`. The first
-- and last entries are looked at first: most windows hold all of a log or none of it.
local function first_after(raw, off, W, n, start)
  if n == 0 or bunpack('>I6', raw, off) > start then
    return 0
  end
  if bunpack('>I6', raw, off + (n - 1) * W) <= start then
    return n
  end
  local lo, hi = 1, n - 1
  while lo < hi do
    local mid = floor((lo + hi) / 2)
    if bunpack('>I6', raw, off + mid * W) > start then hi = mid else lo = mid + 1 end
  end
  return lo
end

-- The index of the first entry from byte `pos` on whose bytes at offset `at` are `needle`
-- (`at` nil: one of its tag slots), and where to look for the next one.
local function next_holding(raw, off, W, n, pos, needle, at)
  local stop = off + n * W
  while pos < stop do
    local s = find(raw, needle, pos, true)
    if not s or s >= stop then
      return nil
    end
    local e = floor((s - off) / W)
    local inside = s - off - e * W
    if (at and inside == at) or (not at and inside >= BASE and (inside - BASE) % 4 == 0) then
      return e, off + (e + 1) * W
    end
    pos = s + 1
  end
  return nil
end

-- The index of the channel's entry for `message`, or nil.
local function entry_of(log, slot, message)
  if not slot then
    return nil
  end
  local off = log[slot + 1]
  return (next_holding(log[1], off, log[3], log[slot + 2], off, message, MESSAGE_AT))
end

--- Rules ------------------------------------------------------------------------------------

-- A rule as a table: [1] kind, [2] every channel, [3] calendar, [4] limit, [5] a, [6] b, [7] c,
-- [8] tag, [9] 1 or 2 when it counts exactly what the channel's 24 h or 7 d count does,
-- [10] its window's start at `now` (entries after it count), [11] a calendar period's end.
local function parse_rules(blob, now, from, to)
  local rules = {}
  for pos = from or 1, to or #blob, RULE do
    local kind, scope, calendar, limit, a, b, c, tag = bunpack('>BBBI4I6I6I6c4', blob, pos)
    local classic, start, period_end = nil, now - a, nil
    if calendar == 1 then
      if now >= b then start, period_end = b - 1, c else start, period_end = a - 1, b end
    elseif kind == 1 and scope == 0 then
      if a == DAY then classic = 1 elseif a == WEEK then classic = 2 end
    end
    rules[#rules + 1] = {kind, scope == 1, calendar == 1, limit, a, b, c, tag, classic, start,
                         period_end}
  end
  return rules
end

-- The sections a rule counts, as slots from, to; nil when the log has none.
local function rule_sections(log, slot, rule)
  if rule[2] then
    if log[4] == 0 then return nil end
    return 5, 2 + 3 * log[4]
  end
  return slot, slot
end

-- Times (oldest first) of the entries a rule counts in its window.
local function counted_times(log, slot, rule, campaign)
  local times = {}
  local from, to = rule_sections(log, slot, rule)
  if not from then
    return times
  end
  local raw, W, start, kind = log[1], log[3], rule[10], rule[1]
  local needle, at = campaign, CAMPAIGN_AT
  if kind == 2 then needle, at = rule[8], nil end
  for s = from, to, 3 do
    local off, n = log[s + 1], log[s + 2]
    local first = first_after(raw, off, W, n, start)
    if kind == 1 then
      for i = first, n - 1 do
        times[#times + 1] = time_at(raw, off, W, i)
      end
    else
      local pos = off + first * W
      while true do
        local e
        e, pos = next_holding(raw, off, W, n, pos, needle, at)
        if not e then break end
        times[#times + 1] = time_at(raw, off, W, e)
      end
    end
  end
  if from ~= to then sort(times) end
  return times
end

-- How many entries a rule counts in its window (every send: binary searches only).
local function count(log, slot, rule, campaign)
  if rule[1] ~= 1 then
    return #counted_times(log, slot, rule, campaign)
  end
  local from, to = rule_sections(log, slot, rule)
  if not from then
    return 0
  end
  local raw, W, start, total = log[1], log[3], rule[10], 0
  for s = from, to, 3 do
    local n = log[s + 2]
    total = total + n - first_after(raw, log[s + 1], W, n, start)
  end
  return total
end

-- Whether a rule has room for one more, told cheaply where it can be: an every-send rule over
-- one section compares the limit-th newest entry with the window's start (one entry read); a
-- tag or campaign rule looks for its hash, and at the time only where it is found. nil: count.
local function has_room(log, slot, rule, campaign)
  local limit = rule[4]
  if limit == 0 then
    return false
  end
  local from, to = rule_sections(log, slot, rule)
  if not from then
    return true
  end
  local raw, W, start = log[1], log[3], rule[10]
  if rule[1] == 1 then
    if from ~= to then return nil end
    local n = log[from + 2]
    return n < limit or time_at(raw, log[from + 1], W, n - limit) <= start
  end
  local total = 0
  for s = from, to, 3 do total = total + log[s + 2] end
  if total < limit then
    return true -- fewer entries than the limit, whatever they carry
  end
  local needle, at = campaign, CAMPAIGN_AT
  if rule[1] == 2 then needle, at = rule[8], nil end
  local found = 0
  for s = from, to, 3 do
    local off, n = log[s + 1], log[s + 2]
    local pos = off
    while true do
      local e
      e, pos = next_holding(raw, off, W, n, pos, needle, at)
      if not e then break end
      if time_at(raw, off, W, e) > start then
        found = found + 1
        if found >= limit then return false end
      end
    end
  end
  return true
end

-- What the fast pass of a rule set reads (see `all_have_room`): the smallest limits of the
-- rules that count what the channel's 24 h and 7 d counts do; the limits and window starts of
-- the other every-send rules, over the channel and over every channel; the tag and campaign
-- rules.
local function fast_pass(rules)
  local fast = {day = math_huge, week = math_huge, clim = {}, cstart = {}, alim = {},
                astart = {}, other = {}}
  for r = 1, #rules do
    local rule = rules[r]
    local classic, limit = rule[9], rule[4]
    if classic == 1 then
      if limit < fast.day then fast.day = limit end
    elseif classic == 2 then
      if limit < fast.week then fast.week = limit end
    elseif rule[1] == 1 and not rule[2] then
      fast.clim[#fast.clim + 1], fast.cstart[#fast.cstart + 1] = limit, rule[10]
    elseif rule[1] == 1 then
      fast.alim[#fast.alim + 1], fast.astart[#fast.astart + 1] = limit, rule[10]
    else
      fast.other[#fast.other + 1] = rule
    end
  end
  return fast
end

-- Whether every rule of a set has room, when that is quick to tell (most requests); false
-- when some rule may not: the caller then goes through the rules one by one.
local function all_have_room(fast, log, slot, day, week, campaign)
  if day >= fast.day or week >= fast.week then
    return false
  end
  local raw, W, C = log[1], log[3], log[4]
  local lim, start = fast.clim, fast.cstart
  if #lim > 0 then
    local n, off = 0, 0
    if slot then n, off = log[slot + 2], log[slot + 1] end
    for q = 1, #lim do
      local limit = lim[q]
      if n >= limit and (limit == 0 or bunpack('>I6', raw, off + (n - limit) * W) > start[q]) then
        return false
      end
    end
  end
  lim, start = fast.alim, fast.astart
  if #lim > 0 then
    if C > 1 then return false end -- counting over several sections: one by one
    local n, off = 0, 0
    if C == 1 then n, off = log[7], log[6] end
    for q = 1, #lim do
      local limit = lim[q]
      if n >= limit and (limit == 0 or bunpack('>I6', raw, off + (n - limit) * W) > start[q]) then
        return false
      end
    end
  end
  local other = fast.other
  for q = 1, #other do
    if not has_room(log, slot, other[q], campaign) then return false end
  end
  return true
end

-- A rule's count, and when it has room for one more: -1 now, false never, else ms from now.
-- `day` and `week` are the channel's rolling counts, which the classic caps reuse.
local function judge(log, slot, rule, now, campaign, day, week)
  local used
  local classic = rule[9]
  if classic == 1 then used = day elseif classic == 2 then used = week
  else used = count(log, slot, rule, campaign) end
  local limit = rule[4]
  if used < limit then
    return used, -1
  end
  if limit == 0 then
    return used, false
  end
  if rule[11] then
    return used, rule[11] - now
  end
  -- The entry that must leave for one more to fit is the (used - limit + 1)-th oldest.
  local times = counted_times(log, slot, rule, campaign)
  return used, times[used - limit + 1] + rule[5] - now
end

local function channel_counts(log, slot, now)
  if not slot then
    return 0, 0
  end
  local raw, off, W, n = log[1], log[slot + 1], log[3], log[slot + 2]
  return n - first_after(raw, off, W, n, now - DAY), n - first_after(raw, off, W, n, now - WEEK)
end

--- Writing a log ----------------------------------------------------------------------------

-- The log as a string with entries at or before `cutoff` dropped and `entry` put into the
-- section at `slot` in time order, the sections where they are: the old string copied as a few
-- ranges, the header rebuilt only when a count it holds changes (the last section's is
-- implicit). nil when it takes a rebuild: a section would be left empty.
local function spliced(log, cutoff, slot, entry, entry_time)
  local raw, T, W, C = log[1], log[2], log[3], log[4]
  if C == 2 and slot == 5 and bunpack('>I6', raw, log[6]) > cutoff
     and bunpack('>I6', raw, log[9]) > cutoff
     and bunpack('>I6', raw, log[9] - W) <= entry_time then
    -- Email and push, the newest entry of the first section, nothing to trim: the first
    -- section's count patched where it sits, the entry put where the second section starts.
    local n, at, point = log[7] + 1, log[11], log[9]
    return sub(raw, 1, at - 1) .. char(floor(n / 256), n % 256) .. sub(raw, at + 2, point - 1)
      .. entry .. sub(raw, point)
  end
  local last = 2 + 3 * C
  local firsts = {}
  local same_header = true
  for s = 5, last, 3 do
    local n = log[s + 2]
    local first = first_after(raw, log[s + 1], W, n, cutoff)
    if first == n and s ~= slot then
      return nil
    end
    firsts[s] = first
    if s ~= last and (first > 0 or s == slot) then same_header = false end
  end
  local pieces
  if same_header then
    pieces = {sub(raw, 1, log[6] - 1)}
  else
    pieces = {char(VERSION, T, C)}
    for s = 5, last, 3 do
      local name = log[s]
      if s == last then
        pieces[#pieces + 1] = char(#name) .. name .. '\0\0'
      else
        local kept = log[s + 2] - firsts[s] + (s == slot and 1 or 0)
        pieces[#pieces + 1] = char(#name) .. name .. char(floor(kept / 256), kept % 256)
      end
    end
  end
  -- The bodies: one run of the old string, broken where a prefix is dropped or the entry goes.
  local run = log[6]
  for s = 5, last, 3 do
    local off, first = log[s + 1], firsts[s]
    if first > 0 then
      if off > run then pieces[#pieces + 1] = sub(raw, run, off - 1) end
      run = off + first * W
    end
    if s == slot then
      local at = first_after(raw, off, W, log[s + 2], entry_time)
      if at < first then at = first end
      local point = off + at * W
      if point > run then pieces[#pieces + 1] = sub(raw, run, point - 1) end
      pieces[#pieces + 1] = entry
      run = point
    end
  end
  if run <= #raw then pieces[#pieces + 1] = sub(raw, run, #raw) end
  return concat(pieces)
end

-- An entry's `held` bytes.
local function held(priority, holder)
  return bpack('>I4', priority * PRIORITY_UNIT + holder)
end

-- The holder in an entry's `held` bytes at `pos`.
local function holder_at(raw, pos)
  return bunpack('>I4', raw, pos + HELD_AT) % PRIORITY_UNIT
end

local function entry_bytes(at, message, campaign, priority, holder, tags, slots)
  local entry = bpack('>I6', at) .. message .. campaign .. held(priority, holder) .. tags
  if slots * 4 > #tags then
    entry = entry .. rep('\0', slots * 4 - #tags)
  end
  return entry
end

local function header(name, n)
  return char(#name) .. name .. char(floor(n / 256), n % 256)
end

-- The log as a string with entries at or before `cutoff` dropped and then, in `channel`'s
-- section, `entry` (padded to `slots` tag slots) put in time order, or the entry at index
-- `remove` taken out. nil when nothing is left.
local function rebuilt(log, cutoff, channel, entry, entry_time, slots, remove)
  local raw, T, W, C = log[1], log[2], log[3], log[4]
  local slot = section_of(log, channel)
  local pad = slots > T and rep('\0', 4 * (slots - T)) or nil
  local headers, bodies, sections = {}, {}, 0
  local function copy(parts, off, from, to)
    if to <= from then return end
    if pad then
      for i = from, to - 1 do
        parts[#parts + 1] = sub(raw, off + i * W, off + (i + 1) * W - 1)
        parts[#parts + 1] = pad
      end
    else
      parts[#parts + 1] = sub(raw, off + from * W, off + to * W - 1)
    end
  end
  -- Sections in header order, but the one that takes `entry` last: the next send on the
  -- same channel is then an append.
  local order = {}
  for s = 5, 2 + 3 * C, 3 do
    if not (entry and s == slot) then order[#order + 1] = s end
  end
  if entry then order[#order + 1] = slot or 0 end
  for o = 1, #order do
    local s = order[o]
    local name, off, n
    if s == 0 then name, off, n = channel, 1, 0 else name, off, n = log[s], log[s + 1], log[s + 2] end
    local first = first_after(raw, off, W, n, cutoff)
    local parts, kept = {}, n - first
    if name == channel and remove then
      if remove >= first then
        copy(parts, off, first, remove)
        copy(parts, off, remove + 1, n)
        kept = kept - 1
      else
        copy(parts, off, first, n)
      end
    elseif name == channel and entry then
      local at = first_after(raw, off, W, n, entry_time)
      if at < first then at = first end
      copy(parts, off, first, at)
      parts[#parts + 1] = entry
      copy(parts, off, at, n)
      kept = kept + 1
    else
      copy(parts, off, first, n)
    end
    if kept > 0 then
      sections = sections + 1
      headers[sections] = header(name, kept)
      bodies[sections] = concat(parts)
    end
  end
  if sections == 0 then
    return nil
  end
  -- The last section's count is implicit.
  headers[sections] = sub(headers[sections], 1, -3) .. '\0\0'
  return char(VERSION, slots, sections) .. concat(headers) .. concat(bodies)
end

-- A message hash as the callers pass it, 8 bytes (shorter ones padded with zeros in front), and
-- the 7 bytes an entry keeps of it.
local function passed_hash(arg)
  if #arg ~= 8 then arg = sub(rep('\0', 8) .. arg, -8) end
  return arg
end

local function message_hash(arg)
  return sub(passed_hash(arg), 1, 7)
end

--- Where a user's logs are ---------------------------------------------------------------

-- A user's two logs (counted and uncounted) are together in one of two keys, never in both:
-- its bucket `<prefix>{b:<id >> 8>}`, or its group's key, the bucket's name and one hex digit
-- (id >> 4 & 15: 16 users, a hash small enough for Redis to keep as a listpack). Both are in
-- one cluster slot. A function's caller names the home key; a user with no log there is looked
-- for in the other. A write goes where the user's logs are, or to the home when nowhere; and
-- when the home is a group and the logs were found in the bucket, they move to the group.

local function is_bucket(key)
  return byte(key, #key) == 125 -- '}'
end

-- The user's other key, `f` its field byte.
local function other_key(key, f)
  if is_bucket(key) then
    return key .. HEX[floor(f / 16)]
  end
  return sub(key, 1, -2)
end

-- Whether a bucket's `expiry` says it holds uncounted logs ('u' after the 13 digits of a time
-- in ms, where the releases before groups look for it).
local function holds_uncounted(expiry)
  return expiry and byte(expiry, 14) == 117
end

-- Whether a bucket's `expiry` says some of its users' logs are in their groups ('g' after the
-- time and any 'u'): only then are its groups read for a user the bucket does not hold.
local function has_groups(expiry)
  return expiry and find(expiry, 'g', 14, true) ~= nil
end

-- The field, value list to write to the key `name` in `changed`: made the first time, when
-- `name` is added to `order` (keys are written in the order they were first changed).
local function to_write(changed, order, name)
  local flat = changed[name]
  if not flat then
    flat = {}
    changed[name] = flat
    order[#order + 1] = name
  end
  return flat
end

-- The time (ms) a key's `expiry` field says it lives until: its digits, before any mark.
local function expiry_ms(expiry)
  return tonumber(expiry) or tonumber(match(expiry, '^%d+'))
end

-- Whether a key's `expiry` (and TTL) must be written: it has none, it would end before `needed`
-- (ms), or it lacks a mark it now needs (`uncounted`, `groups`: see write_bucket). With
-- `needed_text` (`needed`'s digits) two times of 13 digits (2001 to 2286) are compared as text,
-- no number read.
local function due(expiry, needed, needed_text, uncounted, groups)
  if not expiry or (uncounted and not holds_uncounted(expiry))
     or (groups and not has_groups(expiry)) then
    return true
  end
  local c = byte(expiry, 14)
  if needed_text and #needed_text == 13 and byte(expiry, 13) and (c == nil or c < 48 or c > 57) then
    return expiry < needed_text
  end
  return expiry_ms(expiry) < needed
end

-- A time in ms as its digits, the last one made kept (most keys of a call are given one end).
local until_ms_made, until_text_made = nil, nil
local function until_text(ms)
  if ms ~= until_ms_made then until_ms_made, until_text_made = ms, tostring(ms) end
  return until_text_made
end

-- Writes a key's changed fields (a flat field, value list; may be empty), and its `expiry` and
-- TTL when it would end before `needed` (ms) or its marks change: it then lives two days past
-- `needed` (refreshed every other day while written to; the sweep empties an idle key's stale
-- logs long before), or as long as it did if longer. `expiry` is the key's `expiry` field (or nil);
-- `uncounted`: an uncounted log is among the fields; `groups`: the key is a bucket some of whose
-- users' logs are in their groups (the expiry then says so). Returns the key's `expiry` as it
-- now is, and whether it was written.
local function write_bucket(key, flat, expiry, now, needed, uncounted, groups)
  local refresh = due(expiry, needed, nil, uncounted, groups)
  local until_ms = needed + 2 * DAY
  if refresh and expiry then
    local stored = expiry_ms(expiry)
    if stored > until_ms then until_ms = stored end
  end
  if refresh then
    flat[#flat + 1] = EXPIRY
    -- A bucket's is padded past hash-max-listpack-value (64 bytes by default): the bucket is a
    -- hash table from its first write, its users found in O(1) rather than by a scan of up to
    -- 256 of them. A group's 16 users are scanned: it stays a listpack while it can.
    local value = until_text(until_ms) .. ((holds_uncounted(expiry) or uncounted) and 'u' or '')
      .. ((has_groups(expiry) or groups) and 'g' or '')
    if is_bucket(key) then value = value .. EXPIRY_PADDING end
    flat[#flat + 1] = value
  end
  if #flat > 0 then
    redis.call('HSET', key, unpack_list(flat))
  end
  if refresh then
    redis.call('PEXPIRE', key, until_ms - now)
    return flat[#flat], true
  end
  return expiry, false
end

-- After groups' `expiry` was written (`written`: their names): their buckets say they have
-- groups, and live at least as long as each of them. A group written without its expiry lives
-- no longer than when it was last written, its bucket marked then.
local function mark_buckets(written, expiries, now)
  local needs, buckets = {}, {}
  for x = 1, #written do
    local name = written[x]
    local bucket = sub(name, 1, -2)
    local needed = expiry_ms(expiries[name])
    if not needs[bucket] then
      buckets[#buckets + 1] = bucket
      needs[bucket] = needed
    elseif needed > needs[bucket] then
      needs[bucket] = needed
    end
  end
  for x = 1, #buckets do
    local bucket = buckets[x]
    local expiry = expiries[bucket]
    if expiry == nil then expiry = redis.call('HGET', bucket, EXPIRY) end
    expiries[bucket] = write_bucket(bucket, {}, expiry or nil, now, needs[bucket], false, true)
  end
end

-- Writes every key of `order` (its fields in `changed`, its expiry when due: write_bucket), each
-- one's `expiries` entry then as written (read first where nil); then, with `mark`, marks the
-- buckets of the groups whose expiry was written (mark_buckets).
local function write_keys(order, changed, expiries, marks, now, needed, mark)
  local groups = nil
  for x = 1, #order do
    local name = order[x]
    local expiry = expiries[name]
    if expiry == nil then expiry = redis.call('HGET', name, EXPIRY) end
    local written, refreshed = write_bucket(name, changed[name], expiry or nil, now, needed,
      marks[name])
    expiries[name] = written
    if refreshed and not is_bucket(name) then
      groups = groups or {}
      groups[#groups + 1] = name
    end
  end
  if groups and mark then mark_buckets(groups, expiries, now) end
end

-- The common write as one append, or nil when it takes a rebuild: the send goes to the last
-- section, is its newest entry, needs no more tag slots, and nothing has left the retention.
-- `tails` caches, per number of tag slots, what follows the entry's time and message.
local function appended(log, slot, now, cutoff, time6, message, tails, tag_slots)
  local raw, T, W, C = log[1], log[2], log[3], log[4]
  if C == 0 or slot ~= 2 + 3 * C or tag_slots > T then
    return nil
  end
  if time_at(raw, log[slot + 1], W, log[slot + 2] - 1) > now then
    return nil
  end
  for s = 5, slot, 3 do
    if time_at(raw, log[s + 1], W, 0) <= cutoff then
      return nil
    end
  end
  local tail = tails[T]
  if not tail then
    tail = tails[tag_slots] .. rep('\0', 4 * (T - tag_slots))
    tails[T] = tail
  end
  return raw .. time6 .. message .. tail
end

-- HMGET of `fields[f]` for the users `ids[from..to]` (each k * 256 + f) of one key, and of its
-- `expiry` when not known yet (`expiries`: key -> the field, or false).
local READ_LIST = {} -- scratch: the fields one read asks for
local function read_fields(key, ids, from, to, fields, expiries)
  local list, n = READ_LIST, 0
  for x = from, to do
    n = n + 1
    list[n] = fields[ids[x] % 256]
  end
  local ask_expiry = expiries[key] == nil
  if ask_expiry then list[n + 1] = EXPIRY end
  local values = redis.call('HMGET', key, unpack_list(list, 1, ask_expiry and n + 1 or n))
  if ask_expiry then expiries[key] = values[n + 1] or false end
  return values
end

-- Reads the logs of the users `list[from..to]`, not in their home `home`, in the key `name`.
-- Each gets `own[id]`, `other[id]` (its logs through the fields `OWN` and `OTHER`, false for
-- none) and `where[id]` (`name`, or `home` for a user found nowhere). The other logs are read
-- where `other_always` or the key's expiry says it has any.
local ABSENT = {}
local WRITES = {} -- scratch: a run's writes to its home
local function take(name, home, list, from, to, c)
  local values = read_fields(name, list, from, to, c.OWN, c.expiries)
  local others = nil
  if c.other_always or holds_uncounted(c.expiries[name]) then
    others = read_fields(name, list, from, to, c.OTHER, c.expiries)
  end
  local own, other, where = c.own, c.other, c.where
  for x = from, to do
    local id = list[x]
    local a = values[x - from + 1]
    local b = others and others[x - from + 1]
    if a or b then
      own[id], other[id], where[id] = a or false, b or false, name
    else
      own[id], other[id], where[id] = false, false, home
    end
  end
end

-- Reads the groups of the users ABSENT[1..count] of the bucket or group `key` (the other key of
-- each: a group of a bucket, the bucket of a group), grouped by that key.
local function in_groups(key, count, c)
  local absent = {}
  for x = 1, count do absent[x] = ABSENT[x] end
  sort(absent)
  local x = 1
  while x <= count do
    local name = other_key(key, absent[x] % 256)
    local y = x
    while y < count and other_key(key, absent[y + 1] % 256) == name do y = y + 1 end
    take(name, key, absent, x, y, c)
    x = y + 1
  end
end

-- One field's log where it is: (its bytes or nil, the key it is in: the home when nowhere).
local function find_log(key, field)
  local got = redis.call('HMGET', key, field, EXPIRY)
  if got[1] then return got[1], key end
  if is_bucket(key) and not has_groups(got[2]) then return nil, key end
  local other = other_key(key, byte(field, #field))
  local raw = redis.call('HGET', other, field)
  if raw then return raw, other end
  return nil, key
end

--- Functions --------------------------------------------------------------------------------

local function decide(keys, args, each)
  if not floor then bind() end
  local now = clock(args[1])
  local holder = (tonumber(args[7]) or 0) % PRIORITY_UNIT
  local OWN, OTHER = FIELDS, UNCOUNTED
  local uncounted = args[8] == '1'
  local grouped = args[9] == '1' -- every user's logs are in its group: no bucket is read
  if uncounted then OWN, OTHER = UNCOUNTED, FIELDS end
  local dry = args[2] == '1'
  local channel = args[3]
  local priority, retention = tonumber(args[4]), tonumber(args[5])
  local payload = args[6]
  local campaign = sub(payload, 1, 4)
  local tag_slots = byte(payload, 5)
  local tags = sub(payload, 6, 5 + 4 * tag_slots)
  local pos = 6 + 4 * tag_slots
  local sets, fasts = {}, {}
  for s = 1, byte(payload, pos) do
    local count = byte(payload, pos + 1)
    sets[s] = parse_rules(payload, now, pos + 2, pos + 1 + count * RULE)
    fasts[s] = fast_pass(sets[s])
    pos = pos + 1 + count * RULE
  end
  local requests, base = payload, pos + 1
  local n = (#payload - base + 1) / REQUEST
  local cutoff = now - retention
  local needed = now + retention -- what every key written must live until
  local needed_text = tostring(needed)
  local day_start, week_start = now - DAY, now - WEEK
  local time6 = bpack('>I6', now)
  local tails = {[tag_slots] = campaign .. held(priority, holder) .. tags}
  local first_log = nil -- a first send's log before its entry: made once per call
  local out, replies = {}, {}
  local logs = {}     -- key * 256 + field byte -> the user's log: a string, a table, or false
  local others = {}   -- the same -> the user's other log (uncounted, or counted), as read
  local where = {}    -- the same -> the key the user's logs are in (or go to)
  local expiries = {} -- key name -> its `expiry`, or false
  local changed, order = {}, {} -- key name -> field, raw, ... to write (a later value wins)
  local marks = {}    -- key name -> true: an uncounted log is written there
  local moved, moved_order = {}, {} -- key name -> fields whose logs moved to a group
  local ids = {}      -- scratch: the users one read asks for
  local nw = 0        -- the run's writes to its home, WRITES[1..nw] (field, log, ...)
  local found_in = {OWN = OWN, OTHER = OTHER, other_always = uncounted, own = logs,
                    other = others, where = where, expiries = expiries}

  local i = 0
  while i < n do
    -- Requests come grouped by bucket: read the run's users (and the bucket's `expiry`) in one
    -- HMGET. A bucket seen before in this call is read only for users not seen yet.
    local k1, k2 = byte(requests, base + i * REQUEST, base + i * REQUEST + 1)
    local k = k1 * 256 + k2
    local j = i + 1
    while j < n do
      local a, b = byte(requests, base + j * REQUEST, base + j * REQUEST + 1)
      if a * 256 + b ~= k then break end
      j = j + 1
    end
    local wanted = 0
    for m = i, j - 1 do
      local id = k * 256 + byte(requests, base + m * REQUEST + 2)
      if logs[id] == nil then
        logs[id] = false
        wanted = wanted + 1
        ids[wanted] = id
      end
    end
    local key = keys[k]
    if wanted > 0 then
      -- The home read in one HMGET, then the other key for the users not there: a group's
      -- bucket, a bucket's groups when it says it has some. Written out here rather than
      -- through `take`: a decision of a random batch at 1M users cost about 1.5 us more so.
      local list = READ_LIST
      for x = 1, wanted do list[x] = OWN[ids[x] % 256] end
      local asked = wanted
      local read_expiry = expiries[key] == nil
      if read_expiry then
        asked = asked + 1
        list[asked] = EXPIRY
      end
      local values = redis.call('HMGET', key, unpack_list(list, 1, asked))
      if read_expiry then expiries[key] = values[asked] or false end
      local expiry = expiries[key]
      local other_values = nil
      if uncounted or holds_uncounted(expiry) then
        for x = 1, wanted do list[x] = OTHER[ids[x] % 256] end
        other_values = redis.call('HMGET', key, unpack_list(list, 1, wanted))
      end
      local missing = 0
      for x = 1, wanted do
        local id = ids[x]
        local a, b = values[x], other_values and other_values[x]
        logs[id] = a or false -- `where` left nil: the home; `others` nil: none
        if b then others[id] = b end
        if not (a or b) then
          missing = missing + 1
          ABSENT[missing] = id
        end
      end
      if missing > 0 and (has_groups(expiry) or not (grouped or is_bucket(key))) then
        in_groups(key, missing, found_in)
      end
    end

    for m = i, j - 1 do
      local p = base + m * REQUEST
      local set, skip = byte(requests, p + 11), dry -- its rule set; whether to record nothing
      if each and set > 127 then set, skip = set - 128, true end
      local f = byte(requests, p + 2)
      local id = k * 256 + f
      local log = logs[id]
      if type(log) ~= 'table' then
        -- Kept only once written: a second request of the user in the call (rare) parses the
        -- log again.
        log = parse(log or nil, channel)
      end
      local message = sub(requests, p + 3, p + 9)
      local slot = nil
      if log[5] == channel then slot = 5 elseif log[4] > 1 then slot = section_of(log, channel) end
      local day, week = 0, 0
      local first_t, last_t -- the channel's oldest and newest entry
      if slot then
        local raw, off, W, count = log[1], log[slot + 1], log[3], log[slot + 2]
        first_t = bunpack('>I6', raw, off)
        last_t = bunpack('>I6', raw, off + (count - 1) * W)
        -- Most windows hold all of a log or none of it: a search only for the others.
        if last_t <= day_start then day = 0
        elseif first_t > day_start then day = count
        else day = count - first_after(raw, off, W, count, day_start) end
        if last_t <= week_start then week = 0
        elseif first_t > week_start then week = count
        else week = count - first_after(raw, off, W, count, week_start) end
      end
      local outcome, decider, decider_used, retry = 1, 0, 0, 0
      -- A duplicate: its hash somewhere after the section starts (rare), then exactly where;
      -- in the user's other log too. Its holder is answered.
      local found, found_slot, e = log, slot, nil
      if slot and find(log[1], message, log[slot + 1], true) then
        e = entry_of(log, slot, message)
      end
      local other = others[id]
      if not e and other then
        if type(other) ~= 'table' and find(other, message, 1, true) then
          other = parse(other, channel)
          others[id] = other
        end
        if type(other) == 'table' then
          found, found_slot = other, section_of(other, channel)
          e = entry_of(other, found_slot, message)
        end
      end
      if e then
        outcome = 2
        decider_used = holder_at(found[1], found[found_slot + 1] + e * found[3])
      elseif not all_have_room(fasts[set], log, slot, day, week, campaign) then
        local rules = sets[set]
        local never = false
        local raw, W, C = log[1], log[3], log[4]
        for r = 1, #rules do
          local rule = rules[r]
          local classic, limit, room = rule[9], rule[4], nil
          if classic == 1 then
            room = day < limit -- the classic caps' windows are the counts already made
          elseif classic == 2 then
            room = week < limit
          elseif rule[1] == 1 and limit > 0 and (not rule[2] or C < 2) then
            -- Every send, one section (or none): room when the limit-th newest entry is out.
            local s = slot
            if rule[2] then s = C == 1 and 5 or nil end
            if s then
              local n = log[s + 2]
              room = n < limit or bunpack('>I6', raw, log[s + 1] + (n - limit) * W) <= rule[10]
            else
              room = true
            end
          else
            room = has_room(log, slot, rule, campaign)
          end
          if not room then
            local used, wait = judge(log, slot, rule, now, campaign, day, week)
            if wait == false then
              if not never then
                never, outcome, decider, decider_used = true, 3, r, used
              end
            elseif wait >= 0 and not never and (outcome == 1 or wait + 1 > retry) then
              outcome, decider, decider_used, retry = 3, r, used, wait + 1
            end
          end
        end
        if never then retry = 0 end
      end
      if outcome == 1 then
        day, week = day + 1, week + 1
        if not skip then
          local raw
          if slot == 5 and log[4] == 1 and tag_slots <= log[2] and last_t <= now
             and first_t > cutoff then
            -- The common write: the user's one section, the newest entry, nothing to trim.
            local tail = tails[log[2]]
            if not tail then
              tail = tails[tag_slots] .. rep('\0', 4 * (log[2] - tag_slots))
              tails[log[2]] = tail
            end
            raw = log[1] .. time6 .. message .. tail
          elseif log[4] == 0 then
            -- The user's first send (in the retention): a log of one section and one entry.
            if not first_log then
              first_log = char(VERSION, tag_slots, 1) .. char(#channel) .. channel .. '\0\0'
            end
            raw = first_log .. time6 .. message .. tails[tag_slots]
          else
            raw = appended(log, slot, now, cutoff, time6, message, tails, tag_slots)
          end
          if not raw and slot and tag_slots <= log[2] then
            local tail = tails[log[2]] or tails[tag_slots] .. rep('\0', 4 * (log[2] - tag_slots))
            tails[log[2]] = tail
            raw = spliced(log, cutoff, slot, time6 .. message .. tail, now)
          end
          if not raw then
            local slots = tag_slots > log[2] and tag_slots or log[2]
            local entry = entry_bytes(now, message, campaign, priority, holder, tags, slots)
            raw = rebuilt(log, cutoff, channel, entry, now, slots, nil)
          end
          logs[id] = raw -- parsed again only if this user comes again in the call
          local home = key
          local at = where[id] or home
          if at ~= home and not is_bucket(home) then
            -- In the bucket, its home a group: both logs move there.
            local gone = to_write(moved, moved_order, at)
            gone[#gone + 1] = OWN[f]
            local other = others[id]
            if other then
              gone[#gone + 1] = OTHER[f]
              if type(other) == 'table' then other = other[1] end
              local flat = to_write(changed, order, home)
              flat[#flat + 1] = OTHER[f]
              flat[#flat + 1] = other
              if not uncounted then marks[home] = true end
            end
            where[id], at = home, home
          end
          if at == home then
            WRITES[nw + 1], WRITES[nw + 2], nw = OWN[f], raw, nw + 2
          else
            local flat = to_write(changed, order, at)
            flat[#flat + 1] = OWN[f]
            flat[#flat + 1] = raw
          end
          if uncounted then marks[at] = true end
        end
      end
      if decider == 0 and decider_used == 0 and day < 65536 and week < 65536 then
        -- Most replies are alike: made once per call.
        local code = (outcome * 65536 + day) * 65536 + week
        local reply = replies[code]
        if not reply then
          reply = bpack('>BBI4I6I4I4', outcome, 0, 0, 0, day, week)
          replies[code] = reply
        end
        out[m + 1] = reply
      else
        out[m + 1] = bpack('>BBI4I6I4I4', outcome, decider, decider_used, retry, day, week)
      end
    end
    if nw > 0 then
      -- The run's writes to its home: at once when the key's expiry needs nothing (most
      -- runs), else with the key's other changes at the end (its expiry written there).
      if not due(expiries[key], needed, needed_text, uncounted, false) then
        redis.call('HSET', key, unpack_list(WRITES, 1, nw))
      else
        local flat = to_write(changed, order, key)
        for x = 1, nw do flat[#flat + 1] = WRITES[x] end
      end
      nw = 0
    end
    i = j
  end

  -- Once every log is in its group, no release that reads buckets runs: none is marked.
  write_keys(order, changed, expiries, marks, now, needed, not grouped)
  for x = 1, #moved_order do -- the bucket stays, saying it has groups
    redis.call('HDEL', moved_order[x], unpack_list(moved[moved_order[x]]))
  end
  return {now, concat(out)}
end

local function acquire(keys, args)
  return decide(keys, {args[1], args[2], args[3], args[4], args[5], args[6], '0', '0'})
end

local function release(keys, args)
  if not floor then bind() end
  local channel = args[1]
  local reply = {}
  local from, holder = 1, nil -- the previous version's form names no holder
  if #args == 2 + 2 * #keys then
    from, holder = 2, tonumber(args[2]) % PRIORITY_UNIT
    if holder == 0 then holder = nil end
  end
  for i = 1, #keys do
    local field = args[from + 2 * i - 1]
    local message = message_hash(args[from + 2 * i])
    local raw, key = find_log(keys[i], field)
    local removed = 0
    if raw then
      local log = parse(raw)
      local slot = section_of(log, channel)
      local e = entry_of(log, slot, message)
      if e and holder and holder_at(log[1], log[slot + 1] + e * log[3]) ~= holder then
        e = nil -- another job's send
      end
      if e then
        local rest = rebuilt(log, -1, channel, nil, 0, log[2], e)
        if rest then
          redis.call('HSET', key, field, rest)
        else
          redis.call('HDEL', key, field)
        end
        removed = 1
      end
    end
    reply[i] = removed
  end
  return reply
end

local function usage(keys, args)
  if not floor then bind() end
  local now = clock(args[1])
  local log = parse(find_log(keys[1], args[2]) or nil)
  local campaign, reply = args[3], {now}
  for p = 4, #args, 2 do
    local channel = args[p]
    local slot = section_of(log, channel)
    local day, week = channel_counts(log, slot, now)
    local rules = parse_rules(args[p + 1], now)
    for r = 1, #rules do
      local rule = rules[r]
      local used, wait = 0, -1
      if rule[1] == 3 and campaign == NONE then
        -- No campaign named: the campaign that used most of this window.
        local start = rule[10]
        local first_slot, last_slot = rule_sections(log, slot, rule)
        local campaigns = {}
        if first_slot then
          for s = first_slot, last_slot, 3 do
            local off, n = log[s + 1], log[s + 2]
            for i = first_after(log[1], off, log[3], n, start), n - 1 do
              local at = off + i * log[3] + CAMPAIGN_AT
              local c = sub(log[1], at, at + 3)
              if c ~= NONE then campaigns[c] = true end
            end
          end
        end
        for c in pairs(campaigns) do
          local u, w = judge(log, slot, rule, now, c, day, week)
          if w == false then w = -1 end
          if u > used or (u == used and w > wait) then used, wait = u, w end
        end
      else
        used, wait = judge(log, slot, rule, now, campaign, day, week)
        if wait == false then wait = -1 end
      end
      reply[#reply + 1] = used
      reply[#reply + 1] = wait
    end
  end
  return reply
end

local function restore(keys, args)
  if not floor then bind() end
  local now = clock(args[1])
  local cutoff = now - tonumber(args[2])
  local home = keys[1]
  local flats, order, added = {}, {}, 0 -- key -> field, value, ... to write
  local field, log, changed, at = nil, nil, false, nil
  local function keep()
    if not changed then return end
    local flat = to_write(flats, order, at)
    flat[#flat + 1] = field
    flat[#flat + 1] = log[1]
  end
  for p = 3, #args, 4 do
    if args[p] ~= field then
      keep()
      field, changed = args[p], false
      local raw
      raw, at = find_log(home, field)
      log = parse(raw)
    end
    local channel, at, rest = args[p + 1], tonumber(args[p + 2]), args[p + 3]
    local message = sub(rest, 1, 7)
    if at > cutoff and not entry_of(log, section_of(log, channel), message) then
      local tags = sub(rest, 14)
      local slots = log[2]
      if #tags / 4 > slots then slots = #tags / 4 end
      local entry = entry_bytes(at, message, sub(rest, 9, 12), byte(rest, 13), 0, tags, slots)
      log = parse(rebuilt(log, cutoff, channel, entry, at, slots, nil))
      added, changed = added + 1, true
    end
  end
  keep()
  write_keys(order, flats, {}, {}, now, now + tonumber(args[2]), true)
  return added
end

-- The earlier format's entries as gk_restore's: no campaign, priority 5, no tags. Kept in the
-- interface of the version that converted them.
local function import(keys, args)
  if not floor then bind() end
  local rest, field = {args[1], args[2]}, args[3]
  for p = 4, #args, 3 do
    rest[#rest + 1] = field
    rest[#rest + 1] = args[p]
    rest[#rest + 1] = args[p + 1]
    rest[#rest + 1] = passed_hash(args[p + 2]) .. NONE .. char(5)
  end
  return restore(keys, rest)
end

local function sweep(keys, args)
  if not floor then bind() end
  local now = clock(args[1])
  local cutoff = now - tonumber(args[2])
  local flat = redis.call('HGETALL', keys[1])
  local stale = {}
  for k = 1, #flat, 2 do
    if flat[k] ~= EXPIRY then
      local log = parse(flat[k + 1])
      local newest = 0
      for s = 5, 2 + 3 * log[4], 3 do
        local t = time_at(log[1], log[s + 1], log[3], log[s + 2] - 1)
        if t > newest then newest = t end
      end
      if newest <= cutoff then stale[#stale + 1] = flat[k] end
    end
  end
  local deleted = 0
  if #stale > 0 then
    redis.call('HDEL', keys[1], unpack_list(stale))
    -- Nobody left but the bucket's expiry: the bucket goes, unless it says it has groups (it
    -- then expires with them).
    if redis.call('HLEN', keys[1]) == 1 and not has_groups(redis.call('HGET', keys[1], EXPIRY))
       and redis.call('HEXISTS', keys[1], EXPIRY) == 1 then
      redis.call('DEL', keys[1])
      deleted = 1
    end
  end
  return {#stale, deleted}
end

-- Moves every user's logs in the bucket `keys[1]` into its group (args: now, retention ms),
-- the bucket left with its `expiry` saying it has groups, and living as long as they do.
-- Returns how many logs moved. A user's logs are never in both keys; were they, the group's
-- would be kept.
local function group_bucket(keys, args)
  if not floor then bind() end
  local now, retention = clock(args[1]), tonumber(args[2])
  local bucket = keys[1]
  local flat = redis.call('HGETALL', bucket)
  local changed, order, marks, fields, expiry = {}, {}, {}, {}, nil
  for k = 1, #flat, 2 do
    local field = flat[k]
    if field == EXPIRY then
      expiry = flat[k + 1]
    else
      local group = bucket .. HEX[floor(byte(field, #field) / 16)]
      local to = to_write(changed, order, group)
      to[#to + 1] = field
      to[#to + 1] = flat[k + 1]
      if #field > 1 then marks[group] = true end -- an uncounted log
      fields[#fields + 1] = field
    end
  end
  if #fields == 0 then return 0 end
  local expiries = {[bucket] = expiry or false}
  for x = 1, #order do
    local group = order[x]
    local list = changed[group]
    local names = {}
    for y = 1, #list, 2 do names[#names + 1] = list[y] end
    local there = redis.call('HMGET', group, EXPIRY, unpack_list(names))
    local kept = {}
    for y = 1, #names do
      if not there[y + 1] then
        kept[#kept + 1] = names[y]
        kept[#kept + 1] = list[2 * y]
      end
    end
    changed[group], expiries[group] = kept, there[1] or false
  end
  write_keys(order, changed, expiries, marks, now, now + retention, true)
  redis.call('HDEL', bucket, unpack_list(fields))
  return #fields
end

-- A send job chunk's record (see gk_run above).
local function run_record(keys, args)
  if not floor then bind() end
  local key, run = keys[1], args[1]
  if args[3] == 'take' then
    local raw = redis.call('GET', key)
    local states = raw and sub(raw, 17) or ''
    redis.call('SET', key, run .. states, 'PX', args[2])
    return {raw and 1 or 0, states}
  end
  if redis.call('GETRANGE', key, 0, 15) ~= run then
    return 0
  end
  local ops = args[4]
  for p = 1, #ops, 7 do
    local first, n, state = bunpack('>I4HB', ops, p)
    redis.call('SETRANGE', key, 16 + first, rep(char(state), n))
  end
  return 1
end

register('gk_acquire', acquire)
register('gk_decide', decide)
register('gk_decide_each', function(keys, args) return decide(keys, args, true) end)
register('gk_run', run_record)
register('gk_release', release)
register('gk_usage', usage, {'no-writes'})
register('gk_import', import)
register('gk_restore', restore)
register('gk_sweep', sweep)
register('gk_group', group_bucket)
