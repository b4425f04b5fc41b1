--[[
  Reads the same fields of many hashes in one call, answered as one JSON text: a listing of every worker reads
  1,000 records this way, where 1,000 pipelined commands (7,000 reply strings for the client to parse) cost the
  gateway 2-3 times the time and most of its garbage (docs/performance.md).
  Read-only. Callers: Registry.list, active and held (queue/registry.ts), at most READ_BATCH keys a call so one call
  holds Redis for about 2 ms at most.

  Input (the key count comes first: `-n`, as many KEYS as the caller passes):
    KEYS[1..n]  the hashes

    ARGV[1..]   the field names

  Output: a JSON array with one array per hash, its fields' values in ARGV's order (false for a field or hash that
  does not exist); called with at least one key (cjson writes an empty table as {})
]]

local out = {}
for i, key in ipairs(KEYS) do
  out[i] = redis.call('HMGET', key, unpack(ARGV))
end
return cjson.encode(out)
