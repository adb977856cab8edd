"""The names, result codes and shared Lua helpers of kvrelay's job scripts: ``format_script``
fills a script's ``{NAME}`` slots from ``kvrelay.event_log``; ``LUA_HELPERS`` (defined once at
the top of ``kvrelay.lua_library``) holds what several scripts call: msgpack array headers,
a job's records in a worker's tail, the end of a job's log, moving tail records into a log
(``settle``), the server's clock and ``end_unowned``, with which every ending that is not
its own run's fences that run.
"""

from __future__ import annotations

from kvrelay import event_log
from kvrelay.event_log import AppendResult

# How long a worker's fence flag (``Keyspace.worker_fenced``) lasts after another worker
# last claimed one of its jobs: a process that stalls past its leases and wakes up within
# this time still finds every batch checked lease by lease.
FENCE_FLAG_TTL_S = 7 * 86_400
# How long an ended job's end mark (``Keyspace.end_mark``) lasts: a copy of its message
# that turns up later than its record (a restore at a reconnect, a copy held by a stalled
# worker) is dropped, not run as a new job, for this long whatever ``KVRELAY_LOG_TTL`` is.
END_MARK_TTL_S = 3600
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
    "END_MARK_TTL_S": END_MARK_TTL_S,
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
-- Raise a worker's fence flag: its batches are checked job by job from now on (a claim
-- of one of its jobs by another run, a requeue, an unowned ending).
local function raise_fence(fence_prefix, owner)
  redis.call('SET', fence_prefix .. owner, '1', 'EX', {FENCE_FLAG_TTL_S})
end
-- A job's end mark, named after its record (``Keyspace.end_mark``: the same hash tag).
local function end_mark_of(record_key)
  return (string.gsub(record_key, 'job:({[^}]*})$', 'ended:%1'))
end
-- Mark a job ended: its record may expire with its log, the mark outlives both.
local function mark_ended(record_key)
  redis.call('SET', end_mark_of(record_key), '1', 'EX', {END_MARK_TTL_S})
end
-- Is the job's end mark set?
local function end_marked(record_key)
  return redis.call('EXISTS', end_mark_of(record_key)) == 1
end
-- Has the job ended (its record says done, or only its end mark is left)?
local function has_ended(record_key)
  return redis.call('HGET', record_key, 'state') == 'done' or end_marked(record_key)
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
    raise_fence(fence_prefix, record[1])
  end
  redis.call('HSET', record_key, 'state', 'done')
  redis.call('HDEL', record_key, 'payload', 'run', '{MESSAGE_FIELD}', '{MESSAGE_CHECKS_FIELD}')
  redis.call('EXPIRE', record_key, ttl)
  mark_ended(record_key)
  redis.call('DEL', lease_key)
  redis.call('ZREM', running_key, job_id)
  if fresh_key then redis.call('ZREM', fresh_key, job_id) end
end
""")
