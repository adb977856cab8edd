"""Lua scripts that make each job-state transition atomic in Redis.

Every key a script touches is built by ``kvrelay.keys.Keyspace`` and passed in ``KEYS``; the event
log's names and result codes come from ``kvrelay.event_log``. The
job record is a hash: ``state`` (running | queued | done), ``owner``, ``payload``,
``attempts`` (claims so far), ``lost`` (attempts that died with their worker),
``handback`` (owner handing the job back on shutdown).
"""

from __future__ import annotations

import redis
from redis.commands.core import Script

from kvrelay import event_log
from kvrelay.event_log import AppendResult

_CONSTANTS: dict[str, object] = {
    "EVENT_FIELD": event_log.EVENT_FIELD,
    "TERMINAL_FIELD": event_log.TERMINAL_FIELD,
    "DIGEST_FIELD": event_log.DIGEST_FIELD,
    "ENTRY_ID_SUFFIX": event_log.ENTRY_ID_SUFFIX,
    **{result.name: int(result) for result in AppendResult},
}


def supports_flags(client: redis.Redis) -> bool:
    """Script flags (a ``#!lua`` first line) came with Redis 7; 6.2 cannot parse them.

    The version comes from ``HELLO`` (no arguments: the protocol stays as it is), not
    ``INFO``, which a tenant's ACL user may not run (it describes the whole server)."""
    reply = client.execute_command("HELLO")
    raw = reply.get(b"version", reply.get("version", b"0")) if isinstance(reply, dict) else b"0"
    version = raw.decode() if isinstance(raw, bytes) else str(raw)
    return int(version.split(".", 1)[0]) >= 7


def register(client: redis.Redis, source: str, *, flagged: bool,
             allow_oom: bool = False) -> Script:
    """Register a script; where Redis knows script flags, as a flagged script: a server
    out of memory (``maxmemory``, ``noeviction``) then refuses the whole script before it
    runs, never half of its writes, unless it is marked ``allow_oom``."""
    if flagged:
        source = ("#!lua flags=allow-oom\n" if allow_oom else "#!lua\n") + source.lstrip("\n")
    return client.register_script(source)


def _format(script: str) -> str:
    """Put the log format's names and the result codes into a script's ``{NAME}`` slots
    (other braces, Lua's tables, are left alone)."""
    for name, value in _CONSTANTS.items():
        script = script.replace("{" + name + "}", str(value))
    return script

# KEYS: job record, lease, running zset, event log, abort flag
# ARGV: job id, worker id, lease ms, payload json, now ms, record ttl s, request digest
# -> {"done"} | {"reused"} | {"aborted"} | {"owned", owner}
#    | {"claimed", attempt, log entries}
# One round trip does the pickup checks and returns what earlier attempts wrote. A copy
# whose request differs from the one the job id belongs to is "reused" (never run).
CLAIM = _format("""
local state = redis.call('HGET', KEYS[1], 'state')
if state == 'done' then return {'done'} end
local digest = redis.call('HGET', KEYS[1], '{DIGEST_FIELD}')
if digest and digest ~= ARGV[7] then return {'reused'} end
if redis.call('EXISTS', KEYS[5]) == 1 then return {'aborted'} end
-- Any live lease means the job is running (here too: a redelivered copy can come back
-- to its owner); only a lease its holder is handing back may be taken.
local owner = redis.call('GET', KEYS[2])
if owner then
  local handback = redis.call('HGET', KEYS[1], 'handback')
  if handback ~= owner then return {'owned', owner} end
end
local attempt = redis.call('HINCRBY', KEYS[1], 'attempts', 1)
redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3])
redis.call('HSET', KEYS[1], 'state', 'running', 'owner', ARGV[2], 'payload', ARGV[4],
           '{DIGEST_FIELD}', ARGV[7])
redis.call('HDEL', KEYS[1], 'handback')
redis.call('EXPIRE', KEYS[1], ARGV[6])
redis.call('ZADD', KEYS[3], tonumber(ARGV[5]) + tonumber(ARGV[3]), ARGV[1])
return {'claimed', attempt, redis.call('XRANGE', KEYS[4], '-', '+')}
""")

# The job ended here: record it as done (keeping no prompt, only the request's digest, for
# as long as its log), written before the lease is dropped.
# KEYS: job record, lease, running zset
# ARGV: job id, worker id, record ttl s -> 1 if this worker owned the job
RELEASE_DONE = """
if redis.call('GET', KEYS[2]) ~= ARGV[2] then return 0 end
redis.call('HSET', KEYS[1], 'state', 'done')
redis.call('HDEL', KEYS[1], 'payload')
redis.call('EXPIRE', KEYS[1], ARGV[3])
redis.call('ZREM', KEYS[3], ARGV[1])
redis.call('DEL', KEYS[2])
return 1
"""

# KEYS: job record, lease -- ARGV: worker id -> 1 if marked
MARK_HANDBACK = """
if redis.call('GET', KEYS[2]) ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'handback', ARGV[1])
return 1
"""

# KEYS: job record, lease, running zset -- ARGV: job id, worker id -> 1 if released
RELEASE_HANDBACK = """
if redis.call('GET', KEYS[2]) ~= ARGV[2] then return 0 end
redis.call('DEL', KEYS[2])
redis.call('ZREM', KEYS[3], ARGV[1])
redis.call('HSET', KEYS[1], 'state', 'queued')
return 1
"""

# KEYS: lease, running zset -- ARGV: job id, worker id, lease ms, now ms -> 1 if still ours
REFRESH_LEASE = """
if redis.call('GET', KEYS[1]) ~= ARGV[2] then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[3])
redis.call('ZADD', KEYS[2], tonumber(ARGV[4]) + tonumber(ARGV[3]), ARGV[1])
return 1
"""

# Append one event to a job's log and publish it, in the format of ``kvrelay.event_log``
# (entry id ``{seq}-1``, the event in field ``e``, terminal entries also carry ``t``).
# KEYS: event log, lease
# ARGV: channel, worker id ('' = unfenced), seq, event bytes, max log length,
#       terminal (0/1), log ttl s (after a terminal event), live log ttl s (before it),
#       oldest seq to keep (0: keep all; the byte cap, see ``log_window``)
# -> the seq written, or an ``AppendResult``: FENCED (the lease is someone else's),
#    ALREADY_WRITTEN (the log has this seq), and for unfenced writes ENDED (the log
#    already ended) or NOT_NEXT (``seq`` is not the next one: retry).
APPEND_EVENT = _format("""
local seq = tonumber(ARGV[3])
local last = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)
local last_seq = -1
if #last > 0 then last_seq = tonumber(string.match(last[1][1], '^(%d+)')) end
if ARGV[2] ~= '' then
  if redis.call('GET', KEYS[2]) ~= ARGV[2] then return {FENCED} end
  if seq <= last_seq then return {ALREADY_WRITTEN} end
else
  if #last > 0 then
    local fields = last[1][2]
    for i = 1, #fields, 2 do
      if fields[i] == '{TERMINAL_FIELD}' then return {ENDED} end
    end
  end
  if seq ~= last_seq + 1 then return {NOT_NEXT} end
end
local id = seq .. '-{ENTRY_ID_SUFFIX}'
if ARGV[6] == '1' then
  redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[5], id, '{EVENT_FIELD}', ARGV[4],
             '{TERMINAL_FIELD}', '1')
  redis.call('EXPIRE', KEYS[1], ARGV[7])
else
  redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[5], id, '{EVENT_FIELD}', ARGV[4])
  redis.call('EXPIRE', KEYS[1], ARGV[8])
end
if tonumber(ARGV[9]) > 0 then redis.call('XTRIM', KEYS[1], 'MINID', ARGV[9]) end
redis.call('PUBLISH', ARGV[1], ARGV[4])
return seq
""")

# The publisher's whole batch in one call: for every job in it, check the lease once,
# append the job's events to its log and publish each, then trim and set expiry once.
# Redis Cluster is out of scope (Celery has no Cluster broker): the keys of many jobs
# meet in one call.
# KEYS: per job, its event log then its lease
# ARGV: worker id, max log length, then per job: channel, expiry s (0: leave it as is),
#       oldest seq to keep (0: keep all), event count, then per event: seq, terminal
#       (0/1), event bytes
# -> per event, in order: the seq written, or an ``AppendResult``: FENCED (the lease is
#    someone else's: nothing of that job written) or ALREADY_WRITTEN (the log has it: an
#    earlier try of this batch got through). The log's own XADD refuses a seq it already
#    has, so no read precedes the write.
APPEND_BATCH = _format("""
local jobs = #KEYS / 2
local owners = {}
for first = 1, jobs, 512 do
  local last = math.min(first + 511, jobs)
  local leases = {}
  for j = first, last do leases[#leases + 1] = KEYS[2 * j] end
  local got = redis.call('MGET', unpack(leases))
  for i = 1, #got do owners[first + i - 1] = got[i] end
end
local results = {}
local a = 3
for j = 1, jobs do
  local log_key = KEYS[2 * j - 1]
  local channel, expiry = ARGV[a], ARGV[a + 1]
  local keep_from, count = tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3])
  a = a + 4
  local owned = owners[j] == ARGV[1]
  for e = 1, count do
    local seq, data = ARGV[a], ARGV[a + 2]
    local added
    if not owned then
      results[#results + 1] = {FENCED}
    else
      if ARGV[a + 1] == '1' then
        added = redis.pcall('XADD', log_key, 'MAXLEN', '~', ARGV[2], seq .. '-{ENTRY_ID_SUFFIX}',
                            '{EVENT_FIELD}', data, '{TERMINAL_FIELD}', '1')
      else
        added = redis.pcall('XADD', log_key, 'MAXLEN', '~', ARGV[2], seq .. '-{ENTRY_ID_SUFFIX}',
                            '{EVENT_FIELD}', data)
      end
      if type(added) == 'table' and added.err then
        if not string.find(added.err, 'equal or smaller', 1, true) then return added end
        results[#results + 1] = {ALREADY_WRITTEN}
      else
        redis.call('PUBLISH', channel, data)
        results[#results + 1] = tonumber(seq)
      end
    end
    a = a + 3
  end
  if owned and count > 0 then
    if keep_from > 0 then redis.call('XTRIM', log_key, 'MINID', keep_from) end
    if expiry ~= '0' then redis.call('EXPIRE', log_key, expiry) end
  end
end
return results
""")

# Failover check for one job whose lease looked expired.
# KEYS: job record, lease, running zset, requeue marker
# ARGV: job id, max attempts, marker ms, record ttl s (once failed)
# -> {"alive"} | {"gone"} | {"busy"} | {"exhausted"} | {"requeue", payload}
CHECK_EXPIRED = """
if redis.call('EXISTS', KEYS[2]) == 1 then return {'alive'} end
local state = redis.call('HGET', KEYS[1], 'state')
if state ~= 'running' then
  redis.call('ZREM', KEYS[3], ARGV[1])
  return {'gone'}
end
local lost = tonumber(redis.call('HGET', KEYS[1], 'lost') or '0')
if lost + 1 >= tonumber(ARGV[2]) then
  redis.call('HINCRBY', KEYS[1], 'lost', 1)
  redis.call('HSET', KEYS[1], 'state', 'done')
  redis.call('HDEL', KEYS[1], 'payload')
  redis.call('EXPIRE', KEYS[1], ARGV[4])
  redis.call('ZREM', KEYS[3], ARGV[1])
  return {'exhausted'}
end
if not redis.call('SET', KEYS[4], '1', 'NX', 'PX', ARGV[3]) then return {'busy'} end
return {'requeue', redis.call('HGET', KEYS[1], 'payload')}
"""

# After the requeued copy was sent. The marker goes too: it only guards the moment
# between CHECK_EXPIRED and here, and left in place it would stop the next takeover if the
# new owner dies within its lifetime (a second death then waited for the marker, ~10 s).
# KEYS: job record, lease, running zset, requeue marker -- ARGV: job id
COMMIT_REQUEUE = """
redis.call('HINCRBY', KEYS[1], 'lost', 1)
redis.call('DEL', KEYS[4])
if redis.call('EXISTS', KEYS[2]) == 0 then
  redis.call('HSET', KEYS[1], 'state', 'queued')
  redis.call('ZREM', KEYS[3], ARGV[1])
end
return 1
"""
