// Lua scripts that make every job-record change atomic: the state check, the history entry, the indexes,
// the counters and the change notification happen in one step, so racing gateways or workers cannot both win.
import type { RedisClient } from '../shared/redis';

// Shared by create and transition: enter one state, keeping indexes, counters and statistics in step.
const ENTER = `
local function enter(prefix, id, job, hist, prev, to, reason, wid, iso, nowms, seq, q, prio, passing)
  local entry = {state = to, timestamp = iso, reason = reason}
  if wid ~= '' then entry.worker_id = wid end
  redis.call('RPUSH', hist, cjson.encode(entry))
  if to == 'RUNNING' and not redis.call('HGET', job, 'started_at') then redis.call('HSET', job, 'started_at', nowms) end
  -- A state the job only passes through inside this call needs its history entry, not index and counter
  -- updates that the next step would undo.
  if passing then return end
  if prev then
    redis.call('ZREM', prefix .. ':jobs:state:' .. prev, id)
    redis.call('HINCRBY', prefix .. ':counts:state', prev, -1)
    if q then redis.call('HINCRBY', prefix .. ':queue:' .. q .. ':counts', prev, -1) end
    if prev == 'QUEUED' and prio then redis.call('HINCRBY', prefix .. ':queued:by_priority', prio, -1) end
  end
  redis.call('ZADD', prefix .. ':jobs:state:' .. to, seq, id)
  redis.call('HINCRBY', prefix .. ':counts:state', to, 1)
  if q then redis.call('HINCRBY', prefix .. ':queue:' .. q .. ':counts', to, 1) end
  if to == 'QUEUED' and prio then redis.call('HINCRBY', prefix .. ':queued:by_priority', prio, 1) end
  if to == 'COMPLETED' or to == 'FAILED' or to == 'CANCELLED' then
    redis.call('HSET', job, 'finished_at', nowms)
    -- By finish time, for the retention sweep (PURGE).
    redis.call('ZADD', prefix .. ':jobs:finished', nowms, id)
    local stats = prefix .. ':stats'
    redis.call('HINCRBY', stats, 'total:' .. string.lower(to), 1)
    local started = redis.call('HGET', job, 'started_at')
    if started and to ~= 'CANCELLED' then
      local d = (nowms - tonumber(started)) / 1000
      for _, b in ipairs({60, 300, 600}) do
        if d <= b then redis.call('HINCRBY', stats, 'duration_le:' .. b, 1) end
      end
      redis.call('HINCRBY', stats, 'duration_count', 1)
      redis.call('HINCRBYFLOAT', stats, 'duration_sum', d)
    end
  end
end
local function setfields(job, json)
  if json == '' then return end
  for k, v in pairs(cjson.decode(json)) do
    if v == cjson.null or v == false then redis.call('HDEL', job, k) else redis.call('HSET', job, k, tostring(v)) end
  end
end
`;

// KEYS: job, history. ARGV: prefix, id, iso, nowms, fields-json, n, then (to, reason) n times.
const CREATE = ENTER + `
local prefix, id, iso, nowms = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4])
local job, hist = KEYS[1], KEYS[2]
if redis.call('EXISTS', job) == 1 then
  -- The same call resent after a reconnect (its reply was lost) is not a duplicate job_id.
  local op = cjson.decode(ARGV[5]).last_op
  if op and redis.call('HGET', job, 'last_op') == op then return {'ok', redis.call('HGET', job, 'seq')} end
  return {'exists', ''}
end
local seq = redis.call('INCR', prefix .. ':jobs:seq')
setfields(job, ARGV[5])
redis.call('HSET', job, 'seq', seq, 'created_at', iso, 'updated_at', iso, 'state', 'CREATED')
redis.call('ZADD', prefix .. ':jobs', seq, id)
local q = redis.call('HGET', job, 'queue')
local prio = redis.call('HGET', job, 'priority')
if q then redis.call('SADD', prefix .. ':queues', q) end
-- CREATED, then each step; only the state the job ends in enters the indexes and counters (the net effect of
-- entering each in turn).
local n = tonumber(ARGV[6])
enter(prefix, id, job, hist, nil, 'CREATED', 'job submitted', '', iso, nowms, seq, q, prio, n > 0)
local prev, last = 'CREATED', 'job submitted'
for i = 0, n - 1 do
  local to, reason = ARGV[7 + i * 2], ARGV[8 + i * 2]
  enter(prefix, id, job, hist, nil, to, reason, '', iso, nowms, seq, q, prio, i < n - 1)
  prev, last = to, reason
end
redis.call('HSET', job, 'state', prev)
redis.call('PUBLISH', prefix .. ':bus:jobs', cjson.encode({job_id = id, state = prev, timestamp = iso, reason = last}))
return {'ok', tostring(seq)}
`;

// Appends a progress event to the job's log and fans it out (shared by EVENT and TRANSITION).
const ADD_EVENT = `
local function addevent(stream, job, prefix, id, ev, maxlen)
  local eid = redis.call('XADD', stream, 'MAXLEN', '~', maxlen, '*', 'e', ev)
  redis.call('HSET', job, 'latest_event', ev, 'latest_event_id', eid)
  redis.call('PUBLISH', prefix .. ':bus:events', '{"job_id":' .. cjson.encode(id) .. ',"id":"' .. eid .. '","event":' .. ev .. '}')
  return eid
end
`;

// KEYS: job, history, events stream. ARGV: prefix, id, iso, nowms, lease ('' = any), fields-json, n,
// then (to, allowed-from csv, reason, worker id) n times, then event-json ('' = none), maxlen, 'before'|'after'.
// The optional event is recorded in the same atomic step, only if the move is allowed: 'before' the state change
// (a job's last progress event precedes its COMPLETED), 'after' it (RUNNING precedes the first event).
// Returns {'ok', prev, event id} or {code, current state}.
const TRANSITION = ENTER + ADD_EVENT + `
local prefix, id, iso, nowms, lease = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4]), ARGV[5]
local job, hist = KEYS[1], KEYS[2]
local cur = redis.call('HGET', job, 'state')
if not cur then return {'missing', ''} end
-- ioredis resends a command whose reply was lost when Redis went away; if this very call already applied,
-- answer as it did instead of refusing it (which would make the caller undo work it owns).
if ARGV[6] ~= '' then
  local op = cjson.decode(ARGV[6]).last_op
  if op and redis.call('HGET', job, 'last_op') == op then return {'ok', cur, ''} end
end
if lease ~= '' and redis.call('HGET', job, 'lease') ~= lease then return {'lease', cur} end
local n = tonumber(ARGV[7])
local s = cur
for i = 0, n - 1 do
  if not string.find(',' .. ARGV[9 + i * 4] .. ',', ',' .. s .. ',', 1, true) then return {'conflict', cur} end
  s = ARGV[8 + i * 4]
end
local ev, maxlen, evwhen = ARGV[8 + n * 4], ARGV[9 + n * 4], ARGV[10 + n * 4]
local eid = ''
if ev and ev ~= '' and evwhen == 'before' then eid = addevent(KEYS[3], job, prefix, id, ev, maxlen) end
local seq = redis.call('HGET', job, 'seq')
local q = redis.call('HGET', job, 'queue')
local prio = redis.call('HGET', job, 'priority')
local prev, last = cur, ''
for i = 0, n - 1 do
  local to = ARGV[8 + i * 4]
  last = ARGV[10 + i * 4]
  enter(prefix, id, job, hist, prev, to, last, ARGV[11 + i * 4], iso, nowms, seq, q, prio)
  prev = to
end
setfields(job, ARGV[6])
redis.call('HSET', job, 'state', prev, 'updated_at', iso)
redis.call('PUBLISH', prefix .. ':bus:jobs', cjson.encode({job_id = id, state = prev, prev = cur, timestamp = iso, reason = last}))
if ev and ev ~= '' and evwhen == 'after' then eid = addevent(KEYS[3], job, prefix, id, ev, maxlen) end
return {'ok', cur, eid}
`;

// KEYS: events stream, job. ARGV: prefix, id, event-json, maxlen, lease ('' = any).
const EVENT = ADD_EVENT + `
local cur = redis.call('HGET', KEYS[2], 'state')
if not cur then return {'missing', ''} end
if ARGV[5] ~= '' and redis.call('HGET', KEYS[2], 'lease') ~= ARGV[5] then return {'lease', cur} end
return {'ok', addevent(KEYS[1], KEYS[2], ARGV[1], ARGV[2], ARGV[3], ARGV[4])}
`;

// Removes finished jobs older than the cutoff: record, history, events and stored credentials, and the job's
// place in every index and counter (the same ones ENTER keeps), so listings and counts stay in agreement.
// The cumulative statistics (total:<state>, durations) are Prometheus counters and stay.
// ARGV: prefix, cutoff ms, at most this many. Returns the number removed.
const PURGE = `
local prefix, cutoff, limit = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local fin = prefix .. ':jobs:finished'
local ids = redis.call('ZRANGEBYSCORE', fin, '-inf', cutoff, 'LIMIT', 0, limit)
local n = 0
for _, id in ipairs(ids) do
  local job = prefix .. ':job:' .. id
  local st = redis.call('HGET', job, 'state')
  if st == 'COMPLETED' or st == 'FAILED' or st == 'CANCELLED' or not st then
    if st then
      redis.call('ZREM', prefix .. ':jobs:state:' .. st, id)
      redis.call('HINCRBY', prefix .. ':counts:state', st, -1)
      local q = redis.call('HGET', job, 'queue')
      if q then redis.call('HINCRBY', prefix .. ':queue:' .. q .. ':counts', st, -1) end
    end
    redis.call('ZREM', prefix .. ':jobs', id)
    redis.call('DEL', job, job .. ':history', job .. ':events', job .. ':credentials')
    n = n + 1
  end
  redis.call('ZREM', fin, id)
end
return n
`;

export interface FerryScripts {
  ferryCreate(job: string, hist: string, ...args: (string | number)[]): Promise<[string, string]>;
  ferryTransition(job: string, hist: string, events: string, ...args: (string | number)[]): Promise<[string, string, string?]>;
  ferryEvent(stream: string, job: string, ...args: (string | number)[]): Promise<[string, string]>;
  ferryPurge(...args: (string | number)[]): Promise<number>;
}

export function withScripts(redis: RedisClient): RedisClient & FerryScripts {
  const r = redis as RedisClient & FerryScripts;
  if (!(r as any).ferryCreate) {
    redis.defineCommand('ferryCreate', { numberOfKeys: 2, lua: CREATE });
    redis.defineCommand('ferryTransition', { numberOfKeys: 3, lua: TRANSITION });
    redis.defineCommand('ferryEvent', { numberOfKeys: 2, lua: EVENT });
    redis.defineCommand('ferryPurge', { numberOfKeys: 0, lua: PURGE });
  }
  return r;
}
