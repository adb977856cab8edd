"""Lua scripts that make each job-state transition atomic in Redis (functions of
``kvrelay.lua_library``).

Every key a script touches is built by ``kvrelay.keys.Keyspace`` and passed in ``KEYS``; the event
log's names and result codes come from ``kvrelay.event_log``. The
job record is a hash: ``state`` (running | queued | done), ``owner`` (the worker of the
latest claim), ``run`` (that claim's run id), ``payload``, ``attempts`` (claims so far),
``lost`` (attempts that died with their worker), ``handback`` (the run handing the job
back on shutdown; '' when none).

A job's lease holds the run id of the claim that owns it (``run_id``: the worker's id and a
token of that claim), not just the worker's id, so a worker that claims a job it still
runs from before a stall fences that older run like any other, and a claim sent again
after its reply was lost recognises its own lease.

Every ending fences: a job ended by anyone but its own run (a pickup that finds it
cancelled or past its deadline, a rejected message, too many lost workers, any unowned
write of a terminal event) drops the run from its record and raises the fence flag of
the worker that ran it (``end_unowned``), so a run that stalled and wakes up writes
nothing more; and no script writes past a terminal event. The lease scripts are in
``kvrelay.lease_scripts``.
"""

from __future__ import annotations

from kvrelay import event_log
from kvrelay.event_log import AppendResult
from kvrelay.redis_functions import LuaScript

# How long a worker's fence flag (``Keyspace.worker_fenced``) lasts after another worker
# last claimed one of its jobs: a process that stalls past its leases and wakes up within
# this time still finds every batch checked lease by lease.
FENCE_FLAG_TTL_S = 7 * 86_400
# ``APPEND_BATCH``'s answer when its fast path may not write: the fence flag is up or some
# stream watches a job, so the batch must come again with every job's lease and watcher
# count (no job position is 0).
CHECK_EACH_JOB = 0

_CONSTANTS: dict[str, object] = {
    "EVENT_FIELD": event_log.EVENT_FIELD,
    "TERMINAL_FIELD": event_log.TERMINAL_FIELD,
    "DIGEST_FIELD": event_log.DIGEST_FIELD,
    "OWNER_FIELD": event_log.OWNER_FIELD,
    "ENTRY_ID_SUFFIX": event_log.ENTRY_ID_SUFFIX,
    "ENDED_LAST_ID": event_log.ENDED_LAST_ID,
    "TAIL_FIELD": event_log.TAIL_FIELD,
    "RUN_FIELD": event_log.RUN_FIELD,
    "MESSAGE_FIELD": event_log.MESSAGE_FIELD,
    "MESSAGE_CHECKS_FIELD": event_log.MESSAGE_CHECKS_FIELD,
    "FENCE_FLAG_TTL_S": FENCE_FLAG_TTL_S,
    "CHECK_EACH_JOB": CHECK_EACH_JOB,
    **{result.name: int(result) for result in AppendResult},
}


def format_script(script: str) -> str:
    """Put the log format's names and the result codes into a script's ``{NAME}`` slots
    (other braces, Lua's tables, are left alone)."""
    for name, value in _CONSTANTS.items():
        script = script.replace("{" + name + "}", str(value))
    return script

# Helpers some scripts start with: msgpack array headers (``kvrelay.event_frames``), a
# job's record in a tail entry, the end of a job's log, and ``settle``: move a job's
# events that are still only in its owner's tail (``kvrelay.event_log``) into its log,
# as one entry.
LUA_HELPERS = format_script("""
local function array_header(n)
  if n < 16 then return string.char(0x90 + n) end
  if n < 65536 then return string.char(0xdc, math.floor(n / 256), n % 256) end
  return string.char(0xdd, math.floor(n / 16777216) % 256, math.floor(n / 65536) % 256,
                     math.floor(n / 256) % 256, n % 256)
end
local function array_parts(s)
  local b = string.byte(s, 1)
  if b >= 0x90 and b <= 0x9f then return b - 0x90, string.sub(s, 2) end
  if b == 0xdc then return string.byte(s, 2) * 256 + string.byte(s, 3), string.sub(s, 4) end
  local b1, b2, b3, b4 = string.byte(s, 2, 5)
  return ((b1 * 256 + b2) * 256 + b3) * 256 + b4, string.sub(s, 6)
end
-- GET of every key in ``names`` (MGET, in parts of 512 keys), in order.
local function mget_all(names)
  local got = {}
  for first = 1, #names, 512 do
    local part = redis.call('MGET', unpack(names, first, math.min(first + 511, #names)))
    for i = 1, #part do got[first + i - 1] = part[i] end
  end
  return got
end
local function log_end(log_key)
  local last = redis.call('XREVRANGE', log_key, '+', '-', 'COUNT', 1)
  if #last == 0 then return -1, false end
  local seq = tonumber(string.match(last[1][1], '^(%d+)'))
  local fields = last[1][2]
  for i = 1, #fields, 2 do
    if fields[i] == '{TERMINAL_FIELD}' then return seq, true end
  end
  return seq, false
end
-- A terminal entry also sets the log's last id to the top (``ENDED_LAST_ID``): Redis then
-- refuses every later entry, whoever writes it and on whichever path. ``run`` names the
-- run whose events the entry holds (field ``RUN_FIELD``; '' or nil: no run's, an unowned
-- ending, or a run no record names any more).
local function add_log_entry(log_key, max_len, last_seq, data, terminal, run)
  local id = last_seq .. '-{ENTRY_ID_SUFFIX}'
  local fields = {'{EVENT_FIELD}', data}
  if terminal then
    fields[#fields + 1] = '{TERMINAL_FIELD}'
    fields[#fields + 1] = '1'
  end
  if run and run ~= '' then
    fields[#fields + 1] = '{RUN_FIELD}'
    fields[#fields + 1] = run
  end
  local added = redis.pcall('XADD', log_key, 'MAXLEN', '~', max_len, id, unpack(fields))
  if terminal and not (type(added) == 'table' and added.err) then
    redis.call('XSETID', log_key, '{ENDED_LAST_ID}')
  end
  return added
end
-- Whether ``run`` still holds the job: its lease names the run, or the lease is gone
-- (it ran out while Redis was out of reach) and the record still names the run, running.
local function run_holds(lease_key, record_key, run)
  local lease = redis.call('GET', lease_key)
  if lease then return lease == run end
  local record = redis.call('HMGET', record_key, 'state', 'run')
  return record[1] == 'running' and record[2] == run
end
-- Write a job's tail records (``tail_by_job``'s) past its log's end into its log as one
-- entry, as ``run``'s (the run the job's record names: the tail's owner's last claim);
-- returns the log's last seq then, and whether the log has ended.
local function move_records(log_key, records, max_len, ttl, run)
  local last_seq, ended = log_end(log_key)
  if ended then return last_seq, true end
  local parts, count, top, terminal = {}, 0, last_seq, false
  for _, record in ipairs(records) do
    if record[1] > top then
      local n, body = array_parts(record[3])
      parts[#parts + 1] = body
      count = count + n
      top = record[1]
      terminal = record[2]
    end
  end
  if count == 0 then return last_seq, false end
  local added = add_log_entry(log_key, max_len, top, array_header(count) .. table.concat(parts),
                              terminal, run)
  if type(added) == 'table' and added.err then error(added.err) end
  redis.call('EXPIRE', log_key, ttl)
  return top, terminal
end
-- Every job's records in a tail, in order: id -> list of {seq, ended, events array}.
local function tail_by_job(tail_key)
  local per_job, order = {}, {}
  for _, entry in ipairs(redis.call('XRANGE', tail_key, '-', '+')) do
    local fields = entry[2]
    for i = 1, #fields, 2 do
      if fields[i] == '{TAIL_FIELD}' then
        local blob, at = fields[i + 1], 1
        while at <= #blob do
          local id_len, seq, ended, events_len
          id_len, at = struct.unpack('>I2', blob, at)
          local id = string.sub(blob, at, at + id_len - 1)
          seq, ended, events_len, at = struct.unpack('>I4BI4', blob, at + id_len)
          if not per_job[id] then
            per_job[id] = {}
            order[#order + 1] = id
          end
          local list = per_job[id]
          list[#list + 1] = {seq, ended == 1, string.sub(blob, at, at + events_len - 1)}
          at = at + events_len
        end
      end
    end
  end
  return per_job, order
end
-- The previous owner's tail, at a claim of one of its jobs by another worker: every job
-- of that owner which a watch requeued (or it handed back) gets what only the tail holds
-- written into its log now, so it no longer depends on the tail however late its own
-- claim comes; its old run cannot write to it any more (a queued job's batches are
-- fenced, and its moves come after these seqs). Jobs still running are left alone:
-- their owner may be alive and take its leases back after an outage. When no job of the
-- owner but the one being claimed is running, the tail holds nothing a job still needs,
-- and it is given an ended job's log's time at most (a live owner's next batch gives it
-- back its own expiry), so a dead worker's tail goes as its jobs' logs would.
-- heads: the record and log names less the job id and closing brace.
local function settle_owner_tail(tail_key, owner, claimed, heads, max_len, ttl, ended_ttl)
  local per_job, order = tail_by_job(tail_key)
  if #order == 0 then return end
  local running = false
  for _, id in ipairs(order) do
    local record_key, log_key = heads[1] .. id .. '}', heads[2] .. id .. '}'
    local record = redis.call('HMGET', record_key, 'state', '{OWNER_FIELD}', 'run')
    if record[2] == owner and record[1] == 'queued' and id ~= claimed then
      move_records(log_key, per_job[id], max_len, ttl, record[3])
    elseif record[2] == owner and record[1] == 'running' and id ~= claimed then
      running = true
    end
  end
  if not running then
    local left = redis.call('PTTL', tail_key)
    if left == -1 or left > 1000 * tonumber(ended_ttl) then
      redis.call('EXPIRE', tail_key, ended_ttl)
    end
  end
end
local function settle(log_key, tail_key, job_id, max_len, ttl, run)
  if not tail_key then return log_end(log_key) end
  return move_records(log_key, tail_by_job(tail_key)[job_id] or {}, max_len, ttl, run)
end
-- The server's clock, in ms: leases are judged on it alone, so a worker whose own clock
-- is skewed neither delays a takeover nor causes one.
local function server_ms()
  local now = redis.call('TIME')
  return tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
end
-- End a job for good where its own run does not (cancelled or past its deadline at a
-- pickup, rejected, too many lost workers, any unowned end): the record says done and
-- names no run any more, the lease and the running entry go, and the fence flag of the
-- worker whose run it named goes up. A run that stalled and wakes up then writes nothing
-- more: its batches are checked job by job and fenced, and its refreshes, moves and
-- releases find that the record no longer names it. The owner stays (its tail is where
-- an unowned write finds the events that are in no log yet).
local function end_unowned(record_key, lease_key, running_key, job_id, fence_prefix, ttl,
                           fresh_key)
  local record = redis.call('HMGET', record_key, '{OWNER_FIELD}', 'run')
  if record[1] and record[2] and record[2] ~= '' then
    redis.call('SET', fence_prefix .. record[1], '1', 'EX', {FENCE_FLAG_TTL_S})
  end
  redis.call('HSET', record_key, 'state', 'done')
  redis.call('HDEL', record_key, 'payload', 'run', '{MESSAGE_FIELD}', '{MESSAGE_CHECKS_FIELD}')
  redis.call('EXPIRE', record_key, ttl)
  redis.call('DEL', lease_key)
  redis.call('ZREM', running_key, job_id)
  if fresh_key then redis.call('ZREM', fresh_key, job_id) end
end
""")

# KEYS: job record, lease, running zset, event log, abort flag, fresh-jobs zset
# ARGV: job id, worker id, lease ms, payload json, record ttl s, request digest,
#       tail key prefix (``Keyspace.worker_tail`` less the worker id), log max length,
#       fence flag prefix (``Keyspace.worker_fenced`` less the worker id), run id, the
#       job record's and log's names less the job id and closing brace, ended log ttl s
# -> {"done"} | {"reused"} | {"aborted"} | {"owned", owner}
#    | {"claimed", attempt, log entries}
# One round trip does the pickup checks, moves what the previous owner left in its tail
# into the log (and its other requeued jobs': ``settle_owner_tail``), raises the previous
# owner's fence flag (its batches then check each job's lease) unless that run handed
# the job back, and returns what earlier attempts wrote. A copy whose request differs
# from the one the job id belongs to is "reused" (never run). A lease that already holds
# this run id is this claim's own, sent again after its reply was lost: it is answered as
# claimed, with nothing changed.
CLAIM = LuaScript("claim", format_script("""
local record = redis.call('HMGET', KEYS[1], 'state', '{DIGEST_FIELD}', 'handback',
                          '{OWNER_FIELD}', 'attempts', 'run')
-- A copy of this job reached a worker: the watch over a message lost on its way is over.
local function reached()
  redis.call('ZREM', KEYS[6], ARGV[1])
  redis.call('HDEL', KEYS[1], '{MESSAGE_FIELD}', '{MESSAGE_CHECKS_FIELD}')
end
if record[1] == 'done' then reached() return {'done'} end
if record[2] and record[2] ~= ARGV[6] then return {'reused'} end
reached()
local owner = redis.call('GET', KEYS[2])
if owner == ARGV[10] then
  return {'claimed', tonumber(record[5] or '1'), redis.call('XRANGE', KEYS[4], '-', '+')}
end
if redis.call('EXISTS', KEYS[5]) == 1 then return {'aborted'} end
-- Any live lease means the job is running (here too: a redelivered copy can come back
-- to its owner); only a lease its holder is handing back may be taken.
if owner and record[3] ~= owner then return {'owned', owner} end
if record[4] then
  if record[4] ~= ARGV[2] then
    settle_owner_tail(ARGV[7] .. record[4], record[4], ARGV[1], {ARGV[11], ARGV[12]},
                      ARGV[8], ARGV[5], ARGV[13])
  end
  local _, ended = settle(KEYS[4], ARGV[7] .. record[4], ARGV[1], ARGV[8], ARGV[5], record[6])
  if ended then
    -- Its run wrote the terminal event but its release was lost: the job is done.
    redis.call('HSET', KEYS[1], 'state', 'done', 'payload', '')
    redis.call('ZREM', KEYS[3], ARGV[1])
    return {'done'}
  end
  local handed_back = record[3] and record[3] ~= '' and record[3] == record[6]
  if record[4] ~= ARGV[2] or not handed_back then
    redis.call('SET', ARGV[9] .. record[4], '1', 'EX', {FENCE_FLAG_TTL_S})
  end
end
local attempt = tonumber(record[5] or '0') + 1
redis.call('SET', KEYS[2], ARGV[10], 'PX', ARGV[3])
redis.call('HSET', KEYS[1], 'state', 'running', '{OWNER_FIELD}', ARGV[2], 'run', ARGV[10],
           'payload', ARGV[4], '{DIGEST_FIELD}', ARGV[6], 'attempts', attempt, 'handback', '')
redis.call('EXPIRE', KEYS[1], ARGV[5])
redis.call('ZADD', KEYS[3], server_ms() + tonumber(ARGV[3]), ARGV[1])
return {'claimed', attempt, redis.call('XRANGE', KEYS[4], '-', '+')}
"""), helpers=True)

# The job ended here: record it as done (keeping no prompt, only the request's digest, for
# as long as its log), written before the lease is dropped.
# KEYS: job record, lease, running zset
# ARGV: job id, run id, record ttl s -> 1 if this run owned the job
RELEASE_DONE = LuaScript("release_done", """
if not run_holds(KEYS[2], KEYS[1], ARGV[2]) then return 0 end
redis.call('HSET', KEYS[1], 'state', 'done', 'payload', '')
redis.call('EXPIRE', KEYS[1], ARGV[3])
redis.call('ZREM', KEYS[3], ARGV[1])
redis.call('DEL', KEYS[2])
return 1
""", helpers=True)

# Append one event to a job's log and publish it, in the format of ``kvrelay.event_log``,
# for a job the publisher is not batching: one its worker cannot run, or one no worker
# holds (an unfenced write first settles what the last owner left in its tail). Nothing
# is ever written after a terminal event. An unfenced terminal event ends the job for
# good in the same call (``end_unowned``: the run the record named is fenced); an
# unfenced terminal write that finds the log ended marks the record done. Either way the
# last owner's tail is settled as a claim settles it (``settle_owner_tail``): a dead
# owner's tail, whose last running job ends here unclaimed (cancelled at its pickup, or
# out of attempts), goes as an ended job's log would instead of living on.
# KEYS: event log, lease, job record, running zset, fresh-jobs zset
# ARGV: reply channel ('' = none), job channel ('' = none: behind sentinels the caller
#       publishes once a replica holds the event), run id ('' = unfenced), seq, events
#       array (the one event), message (``pack_message`` of its pair), max log length,
#       terminal (0/1), log ttl s (after a terminal event; the ended record's too), live
#       log ttl s (before it), oldest seq to keep (0: keep all; the byte cap, see
#       ``log_window``), tail key prefix, job id, fence flag prefix, the job record's and
#       log's names less the job id and closing brace
# -> the seq written, or an ``AppendResult``: FENCED (the lease is not this run's),
#    ALREADY_WRITTEN (the log has this seq), ENDED (the log already ended: nothing
#    written), and for unfenced writes NOT_NEXT (``seq`` is not the next one: retry).
APPEND_EVENT = LuaScript("append_event", format_script("""
local seq = tonumber(ARGV[4])
local terminal = ARGV[8] == '1'
if ARGV[3] ~= '' then
  if redis.call('GET', KEYS[2]) ~= ARGV[3] then return {FENCED} end
  local last_seq, ended = log_end(KEYS[1])
  if seq <= last_seq then return {ALREADY_WRITTEN} end
  if ended then return {ENDED} end
else
  local record = redis.call('HMGET', KEYS[3], '{OWNER_FIELD}', 'run')
  local tail = nil
  if record[1] then tail = ARGV[12] .. record[1] end
  local last_seq, ended = settle(KEYS[1], tail, ARGV[13], ARGV[7], ARGV[10], record[2])
  if terminal and tail then
    settle_owner_tail(tail, record[1], ARGV[13], {ARGV[15], ARGV[16]}, ARGV[7], ARGV[10],
                      ARGV[9])
  end
  if ended then
    if terminal and redis.call('HGET', KEYS[3], 'state') ~= 'done' then
      redis.call('HSET', KEYS[3], 'state', 'done')
      redis.call('HDEL', KEYS[3], 'payload', '{MESSAGE_FIELD}', '{MESSAGE_CHECKS_FIELD}')
      redis.call('EXPIRE', KEYS[3], ARGV[9])
      redis.call('ZREM', KEYS[4], ARGV[13])
      redis.call('ZREM', KEYS[5], ARGV[13])
    end
    return {ENDED}
  end
  if seq ~= last_seq + 1 then return {NOT_NEXT} end
end
local added = add_log_entry(KEYS[1], ARGV[7], seq, ARGV[5], terminal, ARGV[3])
if type(added) == 'table' and added.err then return added end
if terminal and ARGV[3] == '' then
  end_unowned(KEYS[3], KEYS[2], KEYS[4], ARGV[13], ARGV[14], ARGV[9], KEYS[5])
end
if terminal then redis.call('EXPIRE', KEYS[1], ARGV[9]) else redis.call('EXPIRE', KEYS[1], ARGV[10]) end
if tonumber(ARGV[11]) > 0 then redis.call('XTRIM', KEYS[1], 'MINID', ARGV[11]) end
if ARGV[1] ~= '' then redis.call('PUBLISH', ARGV[1], ARGV[6]) end
if ARGV[2] ~= '' then redis.call('PUBLISH', ARGV[2], ARGV[6]) end
return seq
"""), helpers=True)

# The publisher's whole batch in one call: one tail entry holding every job's events
# (one string, ``event_log.tail_record`` joined), the messages Python packed per client,
# the log entries of the jobs whose events move into their logs this batch, and the
# release of the jobs that ended here with it (``RELEASE_DONE``'s work, so a job's end
# costs no round trip of its own, and its record says done in the same step that writes
# its terminal event).
# Fast path (job count 0): no job is read at all. Writing unchecked is safe while this
# worker's fence flag is down (no other worker has claimed any of its jobs) and no stream
# watches any job (the ``watching`` set is empty); otherwise it answers ``CHECK_EACH_JOB`` and the
# publisher sends the batch again with each job's lease and watcher count. Then one MGET
# reads them; if any lease is someone else's, nothing is written and those jobs are named
# (the publisher drops them and sends the rest again), else each watched job's pair also
# goes out on its own channel.
# Redis Cluster is out of scope (Celery has no Cluster broker): the keys of many jobs
# meet in one call.
# KEYS: the worker's tail, its fence flag, the watching set, then per job checked: its
#       lease, its watcher count, its record; then per move: the job's event log; then,
#       when any job is released, the running zset and per release: the job's record,
#       its lease
# ARGV: worker id, max log length, max tail length, the tail's expiry s (0: leave it),
#       job count (0: the fast path), message count, move count, job channel's name
#       before and after the job id ('' before: publish on no job's channel; behind
#       sentinels the caller publishes, messages too, once a replica holds the batch),
#       the tail entry ('' when no job has events),
#       release count, ended record ttl s, then per job checked: job id, pair
#       (``pack_pair``; '' for a job with nothing new, only a move), run id; per
#       message: channel, message (``pack_message``); per move: its last seq, its events
#       array, terminal (0/1), oldest seq to keep (0: keep all), log expiry s (0: leave it
#       as is), the run whose events they are; per release: job id, run id
# A checked job is this run's while its lease holds the run id (every ending by another
# party drops the lease and the record's run together), or while its lease is gone and
# its record still names this run: running (the lease expired during an outage), or done
# by this very batch (released by an earlier try of it whose reply was lost: the job is
# released here again); otherwise it is fenced, so nothing lands after a terminal event.
# A released job this run still holds (the same rule) is marked done, as
# ``RELEASE_DONE`` does.
# -> {} when written, {CHECK_EACH_JOB} (fast path refused), or the positions (1-based)
#    of the jobs fenced (nothing written). A log entry the log already has (an earlier
#    try of this batch got through) is skipped.
APPEND_BATCH = LuaScript("append_batch", format_script("""
local jobs, messages, moves = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local releases = tonumber(ARGV[11])
local a = 13
-- Where the releases' keys and arguments start.
local rk = 3 + 3 * jobs + moves + 1
local ra = a + 3 * jobs + 2 * messages + 6 * moves
if jobs == 0 then
  if redis.call('EXISTS', KEYS[2], KEYS[3]) > 0 then return {{CHECK_EACH_JOB}} end
else
  local names = {}
  for j = 1, jobs do
    names[2 * j - 1] = KEYS[1 + 3 * j]
    names[2 * j] = KEYS[2 + 3 * j]
  end
  local flags = mget_all(names)
  local released = {}
  for k = 1, releases do released[ARGV[ra + 2 * k - 2]] = true end
  local fenced = {}
  for j = 1, jobs do
    local lease, run = flags[2 * j - 1], ARGV[a + 3 * j - 1]
    if lease ~= run then
      local record = (not lease) and redis.call('HMGET', KEYS[3 + 3 * j], 'state', 'run')
      if not (record and record[2] == run and (record[1] == 'running' or
              (record[1] == 'done' and released[ARGV[a + 3 * j - 3]]))) then
        fenced[#fenced + 1] = j
      end
    end
  end
  if #fenced > 0 then return fenced end
  for j = 1, jobs do
    local watchers, pair = flags[2 * j], ARGV[a + 3 * j - 2]
    if pair ~= '' and ARGV[8] ~= '' and watchers and (tonumber(watchers) or 0) > 0 then
      redis.call('PUBLISH', ARGV[8] .. ARGV[a + 3 * j - 3] .. ARGV[9],
                 array_header(1) .. pair)
    end
  end
end
if ARGV[10] ~= '' then
  redis.call('XADD', KEYS[1], 'MAXLEN', ARGV[3], '*', '{TAIL_FIELD}', ARGV[10])
  -- The tail's expiry, set again once an eighth of it has passed, or at once when it
  -- should be shorter (or longer, after another worker's claim shortened it).
  -- (PTTL, not TTL: a tenant's user may run the one, see ``kvrelay.acl``.)
  local want, left = tonumber(ARGV[4]), redis.call('PTTL', KEYS[1]) / 1000
  if want > 0 and (left < want - math.max(1, math.floor(want / 8)) or left > want) then
    redis.call('EXPIRE', KEYS[1], want)
  end
end
a = a + 3 * jobs
for k = 1, messages do redis.call('PUBLISH', ARGV[a + 2 * k - 2], ARGV[a + 2 * k - 1]) end
a = a + 2 * messages
for k = 1, moves do
  local log_key = KEYS[3 + 3 * jobs + k]
  local added = add_log_entry(log_key, ARGV[2], ARGV[a], ARGV[a + 1], ARGV[a + 2] == '1',
                              ARGV[a + 5])
  if type(added) == 'table' and added.err then
    -- Already there (an earlier try of this batch got through) or past the log's end:
    -- its expiry stands as that write set it, so an ended log is never given more time.
    if not string.find(added.err, 'equal or smaller', 1, true) then return added end
  else
    if tonumber(ARGV[a + 3]) > 0 then redis.call('XTRIM', log_key, 'MINID', ARGV[a + 3]) end
    if ARGV[a + 4] ~= '0' then redis.call('EXPIRE', log_key, ARGV[a + 4]) end
  end
  a = a + 6
end
for k = 1, releases do
  local record, lease = KEYS[rk + 2 * k - 1], KEYS[rk + 2 * k]
  if run_holds(lease, record, ARGV[ra + 2 * k - 1]) then
    redis.call('HSET', record, 'state', 'done', 'payload', '')
    redis.call('EXPIRE', record, ARGV[12])
    redis.call('ZREM', KEYS[rk], ARGV[ra + 2 * k - 2])
    redis.call('DEL', lease)
  end
end
return {}
"""), helpers=True)

# Write a job's events that are only in this worker's tail into its log, as one entry
# (the worker is letting go of the job). Fenced by the record: only while no other run
# has claimed the job since this one (a successor settled the tail itself, and may have
# written these seqs already). Harmless when the log already has them; never past a
# terminal event (the ended log's last id refuses it).
# KEYS: event log, job record -- ARGV: last seq, events array, max log length, log
# expiry s, run id
# -> 1 written, 0 already there, fenced or ended
MOVE_TO_LOG = LuaScript("move_to_log", format_script("""
if redis.call('HGET', KEYS[2], 'run') ~= ARGV[5] then return 0 end
local added = add_log_entry(KEYS[1], ARGV[3], ARGV[1], ARGV[2], false, ARGV[5])
if type(added) == 'table' and added.err then
  if string.find(added.err, 'equal or smaller', 1, true) then return 0 end
  return added
end
redis.call('EXPIRE', KEYS[1], ARGV[4])
return 1
"""), helpers=True)

# Claim a job id for a request in one round trip: the digest set if the id is new (then
# the record expires as a live log would: a job that never reaches a worker keeps its id
# no longer), and the digest the id holds. An id reserved with this digest whose job
# never got onto a queue (no ``ENQUEUED_FIELD``, no ``state``) answers 2: the caller
# pushes it (a second copy, should two retries race, is dropped by the claim). A script,
# not a pipeline: ``EXPIRE NX`` would do it as commands, but Redis 6.2 lacks it.
# KEYS: job record -- ARGV: digest field, digest, ttl s
# -> {created (0/1, 2: reserved but never enqueued), held digest}
RESERVE = LuaScript("reserve", f"""
local created = redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2])
if created == 1 then redis.call('EXPIRE', KEYS[1], ARGV[3]) end
local held = redis.call('HMGET', KEYS[1], ARGV[1], '{event_log.ENQUEUED_FIELD}', 'state')
if created == 0 and held[1] == ARGV[2] and not held[2] and not held[3] then created = 2 end
return {{created, held[1]}}
""")

# One watcher fewer; the count goes with its last watcher (a count at zero would outlive
# the job's log for the count's whole TTL). KEYS: the job's watcher count, the set of
# watching streams -- ARGV: this stream's token.
UNWATCH = LuaScript("unwatch", """
if redis.call('DECR', KEYS[1]) <= 0 then redis.call('DEL', KEYS[1]) end
redis.call('SREM', KEYS[2], ARGV[1])
return 1
""")
