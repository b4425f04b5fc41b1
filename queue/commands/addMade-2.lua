--[[
  Records in a job's ledger something its attempt made on a target (a domain's UUID, a volume's key), under the
  attempt's lease, and makes the job its owner (includes/made.lua): an attempt that lost its job (cancelled, or
  taken over) records nothing, and the import then stops and removes what it could not record. An entry already
  there (same kind and id) is not added again: recording it again only confirms the lease, and the ownership (a
  retry that made it again after its earlier attempt's was removed). The ledger is never trimmed (rollback acts on
  it); a full one refuses.
  Callers: JobStore.recordMade (queue/store.ts) <- the worker's ledger (services/worker/execute.ts).

  Input:
    KEYS[1]  job hash          <prefix>:job:<id>
    KEYS[2]  owners (hash)     <prefix>:made-owners

    ARGV[1]  lease token the job must hold
    ARGV[2]  the entry (JSON object: kind, id, virt_uri, ...)
    ARGV[3]  how many entries a ledger may hold
    ARGV[4]  the job's id

  Output: {'ok', 'added' | 'known'} | {'missing' | 'lease' | 'full', current state}
]]
--- @include "includes/made"

local r = redis.call('HMGET', KEYS[1], 'state', 'lease')
if not r[1] then return {'missing', ''} end
if r[2] ~= ARGV[1] then return {'lease', r[1]} end
local e = cjson.decode(ARGV[2])
local list = ledgerOf(KEYS[1])
local known = false
for _, x in ipairs(list) do
  if x.kind == e.kind and x.id == e.id then known = true end
end
if not known and #list >= tonumber(ARGV[3]) then return {'full', r[1]} end
redis.call('HSET', KEYS[2], madeField(e), ARGV[4])
if known then return {'ok', 'known'} end
list[#list + 1] = e
redis.call('HSET', KEYS[1], 'ledger', cjson.encode(list))
return {'ok', 'added'}
