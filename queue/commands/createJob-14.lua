--[[
  Creates a job record in CREATED and walks it through the given steps (VALIDATED, then QUEUED) in one atomic
  call; only the state it ends in enters the indexes and counters (the net effect of entering each in turn), and
  each step gets its history entry. Callers: JobStore.create (queue/store.ts) <- Lifecycle.submit.

  Input:
    KEYS[1]      job hash                      <prefix>:job:<id>
    KEYS[2]      sequence counter              <prefix>:jobs:seq
    KEYS[3]      known queues (set)            <prefix>:queues
    KEYS[4]      queued jobs per queue and priority (hash)   <prefix>:counts:queued
    KEYS[5]      finished jobs by time (zset)  <prefix>:jobs:finished
    KEYS[6]      statistics (hash)             <prefix>:stats
    KEYS[7..14]  per-state indexes (zsets), in STATES order   <prefix>:jobs:state:<STATE>

    ARGV[1]  state-change channel (BusMessages['jobs'])
    ARGV[2]  job id
    ARGV[3]  now, ISO 8601
    ARGV[4]  now, ms
    ARGV[5]  call id: a resend of this very call (reply lost on a reconnect) is answered, not refused
    ARGV[6]  fields, JSON object (spec, queue, priority, max_attempts, meta when not empty)
    ARGV[7]  n, the number of steps after CREATED
    ARGV[8..] (state, reason) n times

  Output: {'ok', seq} | {'exists', ''} | {'conflict', ''} (a step the transition table does not allow: nothing created)
]]
--- @include "rules"
--- @include "includes/history"
--- @include "includes/moveIndexes"
--- @include "includes/steps"

local id, iso, nowms, op = ARGV[2], ARGV[3], tonumber(ARGV[4]), ARGV[5]
local job = KEYS[1]
local cur = redis.call('HMGET', job, 'state', 'last_op', 'seq')
if cur[1] then
  if cur[2] == op then return {'ok', cur[3]} end
  return {'exists', ''}
end
local n = tonumber(ARGV[7])
local s = checkSteps(INITIAL, n, 8, 2)
if not s then return {'conflict', ''} end

local seq = redis.call('INCR', KEYS[2])
local set = {}
local fields = cjson.decode(ARGV[6])
local j = {seq = seq, queue = fields.queue, priority = fields.priority and tostring(fields.priority)}
local hist = appendHistory(nil, INITIAL, iso, 'job submitted', '')
local last = 'job submitted'
for i = 0, n - 1 do
  last = ARGV[9 + i * 2]
  hist = appendHistory(hist, ARGV[8 + i * 2], iso, last, '')
end
local K = {queued = KEYS[4], finished = KEYS[5], stats = KEYS[6], state = stateKeys(7)}
moveIndexes(K, id, j, nil, s, nowms, set)
if j.queue then redis.call('SADD', KEYS[3], j.queue) end
set.seq = seq
set.created_at = iso
set.updated_at = iso
set.state = s
set.history = hist
set.last_op = op
writeFields(job, fields, set, {})
-- BusMessages['jobs'] (queue/bus.ts); a new job has no prev.
redis.call('PUBLISH', ARGV[1], cjson.encode({job_id = id, state = s, timestamp = iso, reason = last}))
return {'ok', tostring(seq)}
