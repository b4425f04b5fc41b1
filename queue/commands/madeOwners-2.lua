--[[
  A job's ledger with each entry's owner (includes/made.lua), read together so they agree: what rollback, cancel
  clean-up and retries may remove is what the job still owns. Callers: JobStore.ownedMade (queue/store.ts).

  Input:
    KEYS[1]  job hash          <prefix>:job:<id>
    KEYS[2]  owners (hash)     <prefix>:made-owners

  Output: {ledger (JSON array), owner of entry 1 ('' when none), owner of entry 2, ...}
]]
--- @include "includes/made"

local list = ledgerOf(KEYS[1])
local out = {cjson.encode(list)}
for i, e in ipairs(list) do out[i + 1] = redis.call('HGET', KEYS[2], madeField(e)) or '' end
return out
