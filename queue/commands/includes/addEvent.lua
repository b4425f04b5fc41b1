-- Appends a progress event to the job's stream and announces it on the events channel. The message is
-- BusMessages['events'] (queue/bus.ts): {job_id, id, event}; `ev` is already JSON and is spliced in
-- as it is. The caller writes latest_event/latest_event_id with its own HSET (`set`).
local function addEvent(stream, channel, id, ev, maxlen, set)
  local eid = redis.call('XADD', stream, 'MAXLEN', '~', maxlen, '*', 'e', ev)
  set.latest_event = ev
  set.latest_event_id = eid
  redis.call('PUBLISH', channel, '{"job_id":' .. cjson.encode(id) .. ',"id":"' .. eid .. '","event":' .. ev .. '}')
  return eid
end
