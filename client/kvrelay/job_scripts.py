"""Lua scripts that make each job-state transition atomic in Redis (functions of
``kvrelay.lua_library``).

Every key a script touches is built by ``kvrelay.keys.Keyspace`` and passed in ``KEYS``, or
named after one that is (a worker's tail and fence flag from a prefix in ``ARGV``, a job's
end mark from its record: ``end_mark_of``); the event
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
nothing more; and no script writes past a terminal event. The names, result codes and
shared helpers are in ``kvrelay.job_script_helpers``, the scripts that write a job's log in
``kvrelay.log_scripts``, the lease scripts in ``kvrelay.lease_scripts``.
"""

from __future__ import annotations

from kvrelay import event_log
from kvrelay.job_script_helpers import format_script
from kvrelay.redis_functions import LuaScript

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
-- No record at all (it expired, or a producer other than the SDK reserved none): a copy
-- of a job that ended is known by its end mark.
local unrecorded = not record[1] and not record[2]
if record[1] == 'done' or (unrecorded and end_marked(KEYS[1])) then
  reached()
  return {'done'}
end
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
    mark_ended(KEYS[1])
    redis.call('ZREM', KEYS[3], ARGV[1])
    return {'done'}
  end
  local handed_back = record[3] and record[3] ~= '' and record[3] == record[6]
  if record[4] ~= ARGV[2] or not handed_back then
    raise_fence(ARGV[9], record[4])
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
mark_ended(KEYS[1])
redis.call('ZREM', KEYS[3], ARGV[1])
redis.call('DEL', KEYS[2])
return 1
""", helpers=True)

# Claim a job id for a request in one round trip: the digest set if the id is new (then
# the record expires as a live log would: a job that never reaches a worker keeps its id
# no longer; an end mark left by an earlier job under the id goes), and the digest the
# id holds. An id reserved with this digest whose job
# never got onto a queue (no ``ENQUEUED_FIELD``, no ``state``) answers 2: the caller
# pushes it (a second copy, should two retries race, is dropped by the claim). A script,
# not a pipeline: ``EXPIRE NX`` would do it as commands, but Redis 6.2 lacks it.
# KEYS: job record -- ARGV: digest field, digest, ttl s
# -> {created (0/1, 2: reserved but never enqueued), held digest}
RESERVE = LuaScript("reserve", f"""
local created = redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2])
if created == 1 then
  redis.call('EXPIRE', KEYS[1], ARGV[3])
  redis.call('DEL', end_mark_of(KEYS[1]))  -- a new job under an id whose record expired
end
local held = redis.call('HMGET', KEYS[1], ARGV[1], '{event_log.ENQUEUED_FIELD}', 'state')
if created == 0 and held[1] == ARGV[2] and not held[2] and not held[3] then created = 2 end
return {{created, held[1]}}
""", helpers=True)

# One watcher fewer; the count goes with its last watcher (a count at zero would outlive
# the job's log for the count's whole TTL). KEYS: the job's watcher count, the set of
# watching streams -- ARGV: this stream's token.
UNWATCH = LuaScript("unwatch", """
if redis.call('DECR', KEYS[1]) <= 0 then redis.call('DEL', KEYS[1]) end
redis.call('SREM', KEYS[2], ARGV[1])
return 1
""")
