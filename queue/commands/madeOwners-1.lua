--[[
  Who owns each of some things made on a target now (includes/made.lua): the job that made it last, or nobody.
  Rollback, cancel clean-up and retries read it right before each removal. Callers: JobStore.madeGuard and
  JobStore.madeOwners (queue/store.ts).

  Input:
    KEYS[1]  owners (hash)     <prefix>:made-owners

    ARGV[1]  the entries (JSON array of objects: kind, id, virt_uri)

  Output: each entry's owner, in order ('' when none)
]]
--- @include "includes/made"

local out = {}
for i, e in ipairs(cjson.decode(ARGV[1])) do out[i] = redis.call('HGET', KEYS[1], madeField(e)) or '' end
return out
