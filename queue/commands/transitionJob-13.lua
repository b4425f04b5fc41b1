--[[
  Moves a job through one or more states in one atomic step: the transition table and the lease are checked,
  the history gets an entry per step, the indexes and counters make the net move, the caller's fields are
  written, and the change is announced. An optional progress event is recorded in the same step, only when the
  move is allowed: 'before' the state change (a job's last event precedes its COMPLETED) or 'after' it (RUNNING
  precedes the first event). Callers: JobStore.transition (queue/store.ts) <- every Lifecycle move (claim, start,
  complete, fail, handBack, leaseLost, cancel, enqueueExisting).

  Input:
    KEYS[1]      job hash                      <prefix>:job:<id>
    KEYS[2]      job's progress events (stream) <prefix>:job:<id>:events
    KEYS[3]      queued jobs per queue and priority (hash)   <prefix>:counts:queued
    KEYS[4]      finished jobs by time (zset)  <prefix>:jobs:finished
    KEYS[5]      statistics (hash)             <prefix>:stats
    KEYS[6..13]  per-state indexes (zsets), in STATES order   <prefix>:jobs:state:<STATE>

    ARGV[1]  state-change channel (BusMessages['jobs'])
    ARGV[2]  events channel (BusMessages['events'])
    ARGV[3]  job id
    ARGV[4]  now, ISO 8601
    ARGV[5]  now, ms
    ARGV[6]  lease token the job must hold ('' = any)
    ARGV[7]  call id (see createJob)
    ARGV[8]  fields to write, JSON object (null = delete)
    ARGV[9]  n, the number of steps
    ARGV[10..] (state, reason, worker id or '') n times
    then     event JSON ('' = none), events kept per job, 'before' | 'after'

  Output: {'ok', previous state, event id or ''} | {'missing' | 'lease' | 'conflict', current state}
]]
--- @include "rules"
--- @include "includes/history"
--- @include "includes/moveIndexes"
--- @include "includes/addEvent"
--- @include "includes/steps"

local id, iso, nowms, lease, op = ARGV[3], ARGV[4], tonumber(ARGV[5]), ARGV[6], ARGV[7]
local job = KEYS[1]
local fields = ARGV[8] ~= '' and cjson.decode(ARGV[8]) or {}
local nulls = nullFields(fields)
local r = redis.call('HMGET', job, 'state', 'last_op', 'lease', 'seq', 'queue', 'priority', 'started_at', 'history', unpack(nulls))
local cur = r[1]
if not cur then return {'missing', ''} end
-- ioredis resends a command whose reply was lost when Redis went away; if this very call already applied,
-- answer as it did instead of refusing it (which would make the caller undo work it owns).
if r[2] == op then return {'ok', cur, ''} end
if lease ~= '' and r[3] ~= lease then return {'lease', cur} end
local n = tonumber(ARGV[9])
local s = checkSteps(cur, n, 10, 3)
if not s then return {'conflict', cur} end

local j = {seq = r[4], queue = r[5], priority = r[6], started_at = r[7]}
local set = {}
local base = 10 + n * 3
local ev, maxlen, evwhen = ARGV[base], ARGV[base + 1], ARGV[base + 2]
local eid = ''
if ev and ev ~= '' and evwhen == 'before' then eid = addEvent(KEYS[2], ARGV[2], id, ev, maxlen, set) end
local hist, last = r[8], ''
for i = 0, n - 1 do
  local to = ARGV[10 + i * 3]
  last = ARGV[11 + i * 3]
  hist = appendHistory(hist, to, iso, last, ARGV[12 + i * 3])
  if to == STARTED and not j.started_at then
    j.started_at = nowms
    set.started_at = nowms
  end
end
local K = {queued = KEYS[3], finished = KEYS[4], stats = KEYS[5], state = stateKeys(6)}
moveIndexes(K, id, j, cur, s, nowms, set)
set.history = hist
set.state = s
set.updated_at = iso
set.last_op = op
-- BusMessages['jobs'] (queue/bus.ts).
redis.call('PUBLISH', ARGV[1], cjson.encode({job_id = id, state = s, prev = cur, timestamp = iso, reason = last}))
if ev and ev ~= '' and evwhen == 'after' then eid = addEvent(KEYS[2], ARGV[2], id, ev, maxlen, set) end
local present = {}
for i, k in ipairs(nulls) do
  if r[8 + i] then present[#present + 1] = k end
end
writeFields(job, fields, set, present)
return {'ok', cur, eid}
