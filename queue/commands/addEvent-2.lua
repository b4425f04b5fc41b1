--[[
  Records a progress event of a job that exists, under its lease, and announces it. Callers: JobStore.appendEvent
  (queue/store.ts) <- Lifecycle.progress (worker processes, POST /jobs/{id}/events).

  Input:
    KEYS[1]  job hash                        <prefix>:job:<id>
    KEYS[2]  job's progress events (stream)  <prefix>:job:<id>:events

    ARGV[1]  events channel (BusMessages['events'])
    ARGV[2]  job id
    ARGV[3]  event, JSON (a ProgressEvent)
    ARGV[4]  events kept per job (approximate MAXLEN)
    ARGV[5]  lease token the job must hold ('' = any)

  Output: {'ok', event id} | {'missing' | 'lease', current state}
]]
--- @include "includes/addEvent"

local r = redis.call('HMGET', KEYS[1], 'state', 'lease')
if not r[1] then return {'missing', ''} end
if ARGV[5] ~= '' and r[2] ~= ARGV[5] then return {'lease', r[1]} end
local set = {}
local eid = addEvent(KEYS[2], ARGV[1], ARGV[2], ARGV[3], ARGV[4], set)
redis.call('HSET', KEYS[1], 'latest_event', set.latest_event, 'latest_event_id', set.latest_event_id)
return {'ok', eid}
