"""Lua scripts (functions of ``kvrelay.lua_library``) of the watch over jobs admitted and
never claimed (``Keyspace.fresh_jobs``, ``kvrelay_worker.jobs.fresh_watch``).

kombu's consumer takes a message with ``BRPOP``, which removes it from the queue, and
records it as unacknowledged only once the reply has reached the worker: a reply lost on
the way (a connection cut, a worker killed) leaves the message nowhere. Admission keeps
each job's message in its record until the job is claimed (``queue_scripts.ADMIT``), so
a job whose message waits nowhere gets it back.
"""

from __future__ import annotations

from kvrelay import event_log
from kvrelay.redis_functions import LuaScript


def _fields(script: str) -> str:
    return (script.replace("@MESSAGE@", event_log.MESSAGE_FIELD)
            .replace("@CHECKS@", event_log.MESSAGE_CHECKS_FIELD)
            .replace("@PICKED@", event_log.PICKED_FIELD))


# Whether a job of the fresh set is still unclaimed (no lease, no state, its message
# kept); otherwise its entry and message go. The marker (``Keyspace.requeue_marker``) lets
# one watch at a time look for its message.
# KEYS: job record, lease, fresh-jobs zset, marker -- ARGV: job id, marker ms
# -> {"gone"} | {"busy"} | {"due", message, times looked for before}
CHECK_FRESH = LuaScript("check_fresh", _fields("""
local record = redis.call('HMGET', KEYS[1], 'state', '@MESSAGE@', '@CHECKS@')
if record[1] or not record[2] or redis.call('EXISTS', KEYS[2]) == 1 then
  redis.call('ZREM', KEYS[3], ARGV[1])
  if record[2] then redis.call('HDEL', KEYS[1], '@MESSAGE@', '@CHECKS@') end
  return {'gone'}
end
if not redis.call('SET', KEYS[4], '1', 'NX', 'PX', ARGV[2]) then return {'busy'} end
return {'due', record[2], record[3] or '0'}
"""))

# After the watch looked for the message of a job ``CHECK_FRESH`` found due: still
# unclaimed, it is due again later, and where no copy waited (``message`` given) one is
# pushed to the front of the shared queue, marked picked in time when the loss came
# before its queue deadline (``event_log.PICKED_FIELD``). The marker goes.
# KEYS: job record, lease, fresh-jobs zset, marker, target list
# ARGV: job id, message ('' = a copy waits), due again in ms, picked (0/1)
# -> 0 claimed or ended meanwhile, 1 due again, 2 pushed again and due again
SETTLE_FRESH = LuaScript("settle_fresh", _fields("""
redis.call('DEL', KEYS[4])
local record = redis.call('HMGET', KEYS[1], 'state', '@MESSAGE@')
if record[1] or not record[2] or redis.call('EXISTS', KEYS[2]) == 1 then
  redis.call('ZREM', KEYS[3], ARGV[1])
  return 0
end
redis.call('HINCRBY', KEYS[1], '@CHECKS@', 1)
redis.call('ZADD', KEYS[3], server_ms() + tonumber(ARGV[3]), ARGV[1])
if ARGV[2] == '' then return 1 end
redis.call('RPUSH', KEYS[5], ARGV[2])
if ARGV[4] == '1' then redis.call('HSET', KEYS[1], '@PICKED@', '1') end
return 2
"""), helpers=True)
