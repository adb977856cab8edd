"""Lua scripts that place jobs on a model's queues: admission under a limit
(``kvrelay.queue_push``) and moving a dead worker's own queue to the shared one
(``kvrelay_worker.jobs.orphan_queues``)."""

from __future__ import annotations

from kvrelay import event_log
from kvrelay.redis_functions import LuaScript

# When a job's message should have been claimed, where no worker advertised its own
# (``claim_due_ms`` in the queue-limit hash: its lease period).
DEFAULT_CLAIM_DUE_MS = 10_000

# The backlog a model's cap bounds is every job waiting for it: its shared queue and the
# queue of each worker of it that has one (``Keyspace.worker_queues``; a dead worker's
# counts until live workers move it to the shared queue), the target list included, and
# the jobs whose worker's lease on them has expired (``Keyspace.running_jobs`` scored
# below now): live workers will push those back onto the queue without asking, so their
# places are held for them. The
# tenant part (a job id given) checks and counts its quota (``kvrelay.tenant_quota``),
# with only the commands a tenant's ACL user may send (``kvrelay.acl``): the counted
# sets hold at most a limit's worth of live entries, so reading them whole is cheap.
# A job whose record is marked enqueued already is not pushed again: a push sent again
# (its WAIT was judged in doubt, its reply was lost) lands once per server, so a job
# pushed to a demoted primary is pushed to the new one once, and one that got there
# first is not pushed twice.
# A job whose record exists (the SDK reserved its id) keeps its message in the record
# and an entry in the model's fresh set, due when its workers' advertised claim time has
# passed (``claim_due_ms``): a message lost on its way to a worker (popped into a reply
# that never arrived) is pushed again by the watch (``kvrelay_worker.jobs.fresh_watch``).
# KEYS: target list, admission hash, shared queue, worker-queues set, tenant jobs, tenant
#   queued, tenant rate (these three any names without a quota), running-jobs set, the
#   job's record (marked enqueued with the push when it exists:
#   ``event_log.ENQUEUED_FIELD``), the model's fresh-jobs set
# ARGV: message, client cap ('' = none), worker queue name prefix, job id ('' = no
#   quota), counted until (unix s), max jobs, max queued, rate, burst ('' = no limit),
#   job id
# -> {1, length} admitted | {0, backlog, cap, retry} full | {2, jobs, limit, retry} |
#    {3, queued, limit, retry} tenant over a limit | {4, 0, 0, wait s} tenant's rate
ADMIT = LuaScript("admit", """
if redis.call('HGET', KEYS[9], '@ENQUEUED_FIELD@') then
  return {1, redis.call('LLEN', KEYS[1])}
end
local cap = tonumber(redis.call('HGET', KEYS[2], 'max_queue'))
local mine = tonumber(ARGV[2])
if mine and (not cap or mine < cap) then cap = mine end
local retry = redis.call('HGET', KEYS[2], 'retry_after') or ''
if cap then
  local seen = {[KEYS[3]] = true}
  local backlog = redis.call('LLEN', KEYS[3])
  for _, id in ipairs(redis.call('ZRANGE', KEYS[4], 0, -1)) do
    local name = ARGV[3] .. id
    if not seen[name] then
      seen[name] = true
      backlog = backlog + redis.call('LLEN', name)
    end
  end
  if not seen[KEYS[1]] then backlog = backlog + redis.call('LLEN', KEYS[1]) end
  local t = redis.call('TIME')
  local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  backlog = backlog + #redis.call('ZRANGEBYSCORE', KEYS[8], '-inf', '(' .. now_ms)
  if backlog >= cap then return {0, backlog, cap, retry} end
end
if ARGV[4] ~= '' then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
  local counts = {}
  for k = 5, 6 do
    for _, gone in ipairs(redis.call('ZRANGEBYSCORE', KEYS[k], '-inf', now)) do
      redis.call('ZREM', KEYS[k], gone)
    end
    counts[k] = #redis.call('ZRANGE', KEYS[k], 0, -1)
  end
  local max_jobs = tonumber(ARGV[6])
  if max_jobs and counts[5] >= max_jobs then return {2, counts[5], max_jobs, retry} end
  local max_queued = tonumber(ARGV[7])
  if max_queued and counts[6] >= max_queued then return {3, counts[6], max_queued, retry} end
  local rate = tonumber(ARGV[8])
  if rate then
    local burst = tonumber(ARGV[9])
    local state = redis.call('HMGET', KEYS[7], 'tokens', 'at')
    local tokens = tonumber(state[1]) or burst
    local at = tonumber(state[2]) or now
    tokens = math.min(burst, tokens + math.max(0, now - at) * rate)
    if tokens < 1 then return {4, 0, 0, tostring((1 - tokens) / rate)} end
    redis.call('HSET', KEYS[7], 'tokens', tostring(tokens - 1), 'at', tostring(now))
    redis.call('EXPIRE', KEYS[7], math.ceil(burst / rate) + 1)
  end
  local counted_until = tonumber(ARGV[5])
  local ttl = math.ceil(counted_until - now) + 1
  for k = 5, 6 do
    redis.call('ZADD', KEYS[k], counted_until, ARGV[4])
    if redis.call('PTTL', KEYS[k]) < ttl * 1000 then redis.call('EXPIRE', KEYS[k], ttl) end
  end
end
if redis.call('EXISTS', KEYS[9]) == 1 then
  redis.call('HSET', KEYS[9], '@ENQUEUED_FIELD@', '1', '@MESSAGE_FIELD@', ARGV[1])
  local due = tonumber(redis.call('HGET', KEYS[2], 'claim_due_ms')) or @DEFAULT_DUE_MS@
  local t = redis.call('TIME')
  local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  redis.call('ZADD', KEYS[10], now_ms + due, ARGV[10])
end
return {1, redis.call('LPUSH', KEYS[1], ARGV[1])}
""".replace("@ENQUEUED_FIELD@", event_log.ENQUEUED_FIELD)
   .replace("@MESSAGE_FIELD@", event_log.MESSAGE_FIELD)
   .replace("@DEFAULT_DUE_MS@", str(DEFAULT_CLAIM_DUE_MS)))

# KEYS: registry, the worker's heartbeat, then (source, destination) list pairs
# ARGV: worker id, forget-before (ms) -> jobs moved, or -1 when the worker is alive
MOVE_ORPHANS = LuaScript("move_orphans", """
if redis.call('EXISTS', KEYS[2]) == 1 then return -1 end
local moved = 0
for i = 3, #KEYS, 2 do
  local items = redis.call('LRANGE', KEYS[i], 0, -1)
  for first = 1, #items, 1000 do
    redis.call('RPUSH', KEYS[i + 1], unpack(items, first, math.min(first + 999, #items)))
  end
  if #items > 0 then redis.call('DEL', KEYS[i]) end
  moved = moved + #items
end
local seen = redis.call('ZSCORE', KEYS[1], ARGV[1])
if moved == 0 and seen and tonumber(seen) < tonumber(ARGV[2]) then
  redis.call('ZREM', KEYS[1], ARGV[1])
end
return moved
""")

# A message a dead worker took (``Keyspace.celery_delivered`` names it as that worker's)
# and never acknowledged, settled by what the job's record says at this moment: ``done``
# (or its record gone and its end mark left) -> its unacknowledged records are dropped,
# so no copy ever runs it again; ``queued`` (claimed once, then requeued or handed back:
# that step pushed its copy, and the watch pushes another if that one is lost) ->
# dropped too, or the job would have two copies and the late one end it a second time
# once its record expired (seed 10038); claimed
# (``running``, or its lease held) -> left to the lease takeover; otherwise (never claimed,
# or no record at all: a producer other than the SDK reserves none) given back to the
# front of the shared queue (the end consumers pop) with its records gone in the same
# step, so exactly one live worker gives it back. ``picked``: the record is marked picked
# up in time (``event_log.PICKED_FIELD``), created with the live TTL if there is none.
# KEYS: unacked hash, unacked index, delivered hash, target list, the job's record, its lease
# ARGV: tag, the worker it names, message ('' = drop only), picked (0/1), record ttl s
# -> 1 given back, 2 dropped, 0 nothing to do (acknowledged meanwhile, or claimed),
#    -1 not that worker's
RESTORE_DELIVERY = LuaScript("restore_delivery", """
if redis.call('HGET', KEYS[3], ARGV[1]) ~= ARGV[2] then return -1 end
local state = redis.call('HGET', KEYS[5], 'state')
if state == 'running' or redis.call('EXISTS', KEYS[6]) == 1 then return 0 end
redis.call('HDEL', KEYS[3], ARGV[1])
if not redis.call('HGET', KEYS[1], ARGV[1]) then return 0 end
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
if ARGV[3] == '' or state == 'done' or state == 'queued' or end_marked(KEYS[5]) then
  return 2
end
redis.call('RPUSH', KEYS[4], ARGV[3])
if ARGV[4] == '1' then
  redis.call('HSET', KEYS[5], '@PICKED_FIELD@', '1')
  if redis.call('PTTL', KEYS[5]) < 0 then redis.call('EXPIRE', KEYS[5], ARGV[5]) end
end
return 1
""".replace("@PICKED_FIELD@", event_log.PICKED_FIELD), helpers=True)

# A message some worker holds unacknowledged whose job has ended (its record says
# ``done``, or only its end mark is left): its records go, whoever holds it. A consumer
# that restored its messages at a reconnect, and lost that restore in a failover, never
# acknowledges them again; a live
# worker's copy of an ended job only waits for the claim to drop it.
# KEYS: unacked hash, unacked index, delivered hash, the job's record -- ARGV: tag
# -> 1 dropped, 0 its job has not ended
DROP_ENDED_DELIVERY = LuaScript("drop_ended_delivery", """
if not has_ended(KEYS[4]) then return 0 end
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('HDEL', KEYS[3], ARGV[1])
return 1
""", helpers=True)
