"""Lua scripts for a job's lease (functions of ``kvrelay.lua_library``): keeping it,
finding and taking over the jobs whose lease ran out, handing a job back, and
registering again a held job whose record Redis lost.

The job record's fields and the shared helpers (``server_ms``, ``end_unowned``,
``mget_all``) are those of ``kvrelay.job_script_helpers``. Every expiry is judged on the
server's clock (``TIME``), never on a worker's: a worker whose clock is skewed must
neither delay the takeover of its jobs nor take over another's early.
"""

from __future__ import annotations

from kvrelay import event_log
from kvrelay.job_script_helpers import format_script
from kvrelay.redis_functions import LuaScript

# The job's running entry is scored 0 from the mark on: the admission script counts
# entries scored in the past as jobs about to be pushed back, so its place in the
# model's backlog is held until its copy is queued (and the release drops the entry).
# KEYS: job record, lease, running zset -- ARGV: run id, job id -> 1 if marked
MARK_HANDBACK = LuaScript("mark_handback", """
if redis.call('GET', KEYS[2]) ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'handback', ARGV[1])
redis.call('ZADD', KEYS[3], 'XX', 0, ARGV[2])
return 1
""")

# The job stays in the running zset, scored by when its copy should have been claimed
# (``REARM_QUEUED``): a copy that never arrives is noticed there.
# KEYS: job record, lease, running zset -- ARGV: job id, run id, claim due in ms
# -> 1 if released
RELEASE_HANDBACK = LuaScript("release_handback", """
if redis.call('GET', KEYS[2]) ~= ARGV[2] then return 0 end
redis.call('DEL', KEYS[2])
redis.call('ZADD', KEYS[3], server_ms() + tonumber(ARGV[3]), ARGV[1])
redis.call('HSET', KEYS[1], 'state', 'queued')
return 1
""", helpers=True)

# Every held job's lease at once (one MGET, one ZADD; a PEXPIRE per job still held),
# and whether it was aborted (its abort flag, in case the control message was missed).
# A lease that expired while Redis was out of reach (refusing writes, failing over) and
# that no other run has claimed since (the record still names this run, running) is
# taken again: an outage is not a death. A job whose record is gone altogether (Redis
# restarted without persistence) is reported as such, for ``REREGISTER``.
# KEYS: running zset, then per job: lease, abort flag, job record
# ARGV: lease ms, then per job: job id, run id
# -> per job: 0 (the lease is someone else's now), 1 (extended) or 4 (no record: lost
#    with Redis's keys), plus 2 when aborted
REFRESH_LEASES = LuaScript("refresh_leases", """
local flags = {}
local jobs = (#KEYS - 1) / 3
for j = 1, jobs do
  flags[2 * j - 1] = KEYS[3 * j - 1]
  flags[2 * j] = KEYS[3 * j]
end
local got = mget_all(flags)
local results, members = {}, {}
local expiry = server_ms() + tonumber(ARGV[1])
for j = 1, jobs do
  local code = 0
  local run = ARGV[1 + 2 * j]
  local lease = got[2 * j - 1]
  if lease == run then
    redis.call('PEXPIRE', KEYS[3 * j - 1], ARGV[1])
    code = 1
  elseif not lease then
    local record = redis.call('HMGET', KEYS[3 * j + 1], 'state', 'run')
    if record[1] == 'running' and record[2] == run then
      redis.call('SET', KEYS[3 * j - 1], run, 'PX', ARGV[1])
      code = 1
    elseif not record[1] then
      code = 4
    end
  end
  if code == 1 then
    members[#members + 1] = expiry
    members[#members + 1] = ARGV[2 * j]
  end
  if got[2 * j] then code = code + 2 end
  results[j] = code
end
for first = 1, #members, 4000 do
  redis.call('ZADD', KEYS[1], unpack(members, first, math.min(first + 3999, #members)))
end
return results
""", helpers=True, flags=("allow-oom",))

# A held job whose record Redis lost (restarted without persistence, or failed over to
# a replica that never had it) is registered again as this run's, running, with its
# lease and running entry: the job goes on, and is taken over should this worker die.
# Not while this worker's fence flag is up: then Redis kept its keys, and the record is
# gone because the job ended elsewhere and expired (a stalled run must not bring it back).
# KEYS: job record, lease, running zset, this worker's fence flag
# ARGV: job id, worker id, run id, payload json, request digest, attempts, lease ms,
#       record ttl s
# -> 1 registered again, 0 not (a lease or a record state is there, another request's
#    digest holds the id, or the fence flag is up)
REREGISTER = LuaScript("reregister", format_script("""
if redis.call('EXISTS', KEYS[4], KEYS[2]) > 0 then return 0 end
local record = redis.call('HMGET', KEYS[1], 'state', '{DIGEST_FIELD}')
if record[1] then return 0 end
if record[2] and record[2] ~= ARGV[5] then return 0 end
redis.call('SET', KEYS[2], ARGV[3], 'PX', ARGV[7])
redis.call('HSET', KEYS[1], 'state', 'running', '{OWNER_FIELD}', ARGV[2], 'run', ARGV[3],
           'payload', ARGV[4], '{DIGEST_FIELD}', ARGV[5], 'attempts', ARGV[6], 'handback', '')
redis.call('EXPIRE', KEYS[1], ARGV[8])
redis.call('ZADD', KEYS[3], server_ms() + tonumber(ARGV[7]), ARGV[1])
return 1
"""), helpers=True)

# The jobs of a model whose lease expiry (as last refreshed) has passed, by the server's
# clock. KEYS: running zset -- ARGV: how many at most -> job ids
EXPIRED_JOBS = LuaScript("expired_jobs", """
return redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', server_ms(), 'LIMIT', 0, ARGV[1])
""", helpers=True, flags=("no-writes",))

# Failover check for one job whose lease looked expired. A job that lost too many
# workers ends here for good (``end_unowned``: the run it named is fenced, should it
# only have stalled); its ``worker_lost`` event follows as an unowned write.
# KEYS: job record, lease, running zset, requeue marker
# ARGV: job id, max attempts, marker ms, record ttl s (once failed), fence flag prefix
# A job left ``queued`` (requeued or handed back) whose copy was not claimed by its due
# time is answered ``queued`` with its payload, under the requeue marker: the watch looks
# for its copy and pushes one where there is none (``REARM_QUEUED`` follows).
# -> {"alive"} | {"gone"} | {"busy"} | {"exhausted", payload} | {"queued", payload}
#    | {"requeue", payload, run id of the run that lost its lease}
CHECK_EXPIRED = LuaScript("check_expired", """
if redis.call('EXISTS', KEYS[2]) == 1 then return {'alive'} end
local state = redis.call('HGET', KEYS[1], 'state')
if state == 'queued' then
  if not redis.call('SET', KEYS[4], '1', 'NX', 'PX', ARGV[3]) then return {'busy'} end
  return {'queued', redis.call('HGET', KEYS[1], 'payload')}
end
if state ~= 'running' then
  redis.call('ZREM', KEYS[3], ARGV[1])
  return {'gone'}
end
local lost = tonumber(redis.call('HGET', KEYS[1], 'lost') or '0')
if lost + 1 >= tonumber(ARGV[2]) then
  local payload = redis.call('HGET', KEYS[1], 'payload')
  redis.call('HINCRBY', KEYS[1], 'lost', 1)
  end_unowned(KEYS[1], KEYS[2], KEYS[3], ARGV[1], ARGV[5], ARGV[4])
  return {'exhausted', payload}
end
if not redis.call('SET', KEYS[4], '1', 'NX', 'PX', ARGV[3]) then return {'busy'} end
local record = redis.call('HMGET', KEYS[1], 'payload', 'run')
return {'requeue', record[1], record[2] or ''}
""", helpers=True)

# After the requeued copy was sent. The marker goes too: it only guards the moment
# between CHECK_EXPIRED and here, and left in place it would stop the next takeover if the
# new owner dies within its lifetime (a second death then waited for the marker, ~10 s).
# The death counts unless the lease is back with the run that lost it (its owner took it
# again after an outage: the copy is a duplicate its claim drops); a lease another run
# holds already (the copy was claimed first) still counts the death, and that run's
# state and running entry are left as they are; so are those of a job that ended
# meanwhile (its copy found it cancelled: it stays done).
# A job set ``queued`` here stays in the running zset, scored by when its copy should have
# been claimed: a copy lost on its way (pushed to a primary that was then demoted, or
# taken by a worker killed while it held the message only in memory) is noticed by the
# watch (``CHECK_EXPIRED``'s ``queued``) and pushed again; a claim scores it as usual.
# Its owner's fence flag goes up as a claim's would: a run that only stalled (cut off,
# blackholed) and wakes up before the copy is claimed must have its batches checked job
# by job, or its fast path would move events past the ones a checked batch refused
# into the log (a gap: seed 10017).
# KEYS: job record, lease, running zset, requeue marker
# ARGV: job id, the lost run id, claim due in ms, fence flag prefix
COMMIT_REQUEUE = LuaScript("commit_requeue", format_script("""
redis.call('DEL', KEYS[4])
local lease = redis.call('GET', KEYS[2])
if lease and lease == ARGV[2] then return 0 end
redis.call('HINCRBY', KEYS[1], 'lost', 1)
if not lease and redis.call('HGET', KEYS[1], 'state') == 'running' then
  redis.call('HSET', KEYS[1], 'state', 'queued')
  redis.call('ZADD', KEYS[3], server_ms() + tonumber(ARGV[3]), ARGV[1])
  local owner = redis.call('HGET', KEYS[1], '{OWNER_FIELD}')
  if owner then raise_fence(ARGV[4], owner) end
end
return 1
"""), helpers=True)

# After the watch looked for the copy of a job left ``queued`` (and pushed one where there
# was none): due again later, unless it was claimed or ended meanwhile. The marker goes.
# KEYS: job record, lease, running zset, requeue marker -- ARGV: job id, claim due in ms
# -> 1 due again, 0 no longer queued
REARM_QUEUED = LuaScript("rearm_queued", """
redis.call('DEL', KEYS[4])
if redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
if redis.call('HGET', KEYS[1], 'state') ~= 'queued' then return 0 end
redis.call('ZADD', KEYS[3], server_ms() + tonumber(ARGV[2]), ARGV[1])
return 1
""", helpers=True)

# A job this worker's run ended, written done again after an outage that may have lost
# the release (``kvrelay_worker.jobs.recent_endings``): unless its record already says
# done, or is gone while it may have expired as an ended job's does (it must not come
# back; ``ARGV[4]`` '1': it was still to live when the outage began, so a restart lost
# it), or another run holds its lease now (the job runs again: too late), the record
# says done, keeps no prompt, names no run and expires as an ended job's; its lease,
# running and fresh entries go; its end mark is set.
# KEYS: job record, lease, running zset, fresh-jobs zset
# ARGV: job id, run id, record ttl s, lost (0/1)
# -> 1 written again, 0 already done or expired, -1 another run's
REASSERT_END = LuaScript("reassert_end", """
local state = redis.call('HGET', KEYS[1], 'state')
if state == 'done' then return 0 end
if ARGV[4] ~= '1' and redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
local lease = redis.call('GET', KEYS[2])
if lease and lease ~= ARGV[2] then return -1 end
redis.call('HSET', KEYS[1], 'state', 'done')
redis.call('HDEL', KEYS[1], 'payload', 'run', '@MESSAGE@', '@CHECKS@')
redis.call('EXPIRE', KEYS[1], ARGV[3])
mark_ended(KEYS[1])
redis.call('DEL', KEYS[2])
redis.call('ZREM', KEYS[3], ARGV[1])
redis.call('ZREM', KEYS[4], ARGV[1])
return 1
""".replace("@MESSAGE@", event_log.MESSAGE_FIELD)
   .replace("@CHECKS@", event_log.MESSAGE_CHECKS_FIELD), helpers=True)
