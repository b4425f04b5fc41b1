--[[
  Gives up a job's ownership of things it removed (or found gone), so that its ledger entries no longer name
  anything it may remove: a later job that makes the same volume path owns that one (includes/made.lua). Only
  fields this job still owns are removed. Callers: JobStore.releaseMade (queue/store.ts).

  Input:
    KEYS[1]  owners (hash)     <prefix>:made-owners

    ARGV[1]  the job's id
    ARGV[2]  the entries (JSON array of objects: kind, id, virt_uri)

  Output: how many ownerships were given up
]]
--- @include "includes/made"

local n = 0
for _, e in ipairs(cjson.decode(ARGV[2])) do
  local f = madeField(e)
  if redis.call('HGET', KEYS[1], f) == ARGV[1] then n = n + redis.call('HDEL', KEYS[1], f) end
end
return n
