-- A job's state history is one field of its hash: a JSON array, appended to without decoding it.
local function appendHistory(hist, to, iso, reason, workerId)
  local e = {state = to, timestamp = iso, reason = reason}
  if workerId and workerId ~= '' then e.worker_id = workerId end
  local s = cjson.encode(e)
  if not hist or hist == '' then return '[' .. s .. ']' end
  return string.sub(hist, 1, -2) .. ',' .. s .. ']'
end
