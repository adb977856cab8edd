"""Lua scripts that write a job's events (functions of ``kvrelay.lua_library``): one event
(``APPEND_EVENT``, fenced by a run's lease or unowned), a publisher's batch for many jobs
with the releases of those that ended (``APPEND_BATCH``), and a worker letting go of a
job's events still in its tail (``MOVE_TO_LOG``), in the format of ``kvrelay.event_log``.
No script writes past a terminal event; an ended log's expiry is never renewed.
"""

from __future__ import annotations

from kvrelay.job_script_helpers import format_script
from kvrelay.redis_functions import LuaScript

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
      mark_ended(KEYS[3])
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
    mark_ended(record)
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
