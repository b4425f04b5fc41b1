-- A job's state history is one field of its hash: a JSON array, appended to without decoding it. Each entry is
-- [state, timestamp, reason] or [state, timestamp, reason, worker id] (JobStore.get turns them into the API's
-- {state, timestamp, reason, worker_id?}); arrays rather than objects keep the record small.
local function appendHistory(hist, to, iso, reason, workerId)
  local e = {to, iso, reason}
  if workerId and workerId ~= '' then e[4] = workerId end
  local s = cjson.encode(e)
  if not hist or hist == '' then return '[' .. s .. ']' end
  return string.sub(hist, 1, -2) .. ',' .. s .. ']'
end
