--[[
  Records in a job's ledger something its attempt made on a target (a domain's UUID, a volume's key), under the
  attempt's lease: an attempt that lost its job (cancelled, or taken over) records nothing, and the import then
  stops and removes what it could not record. An entry already there (same kind and id) is not added again: recording
  it again only confirms the lease. The ledger is never trimmed (rollback acts on it); a full one refuses.
  Callers: JobStore.recordMade (queue/store.ts) <- the worker's ledger (services/worker/execute.ts).

  Input:
    KEYS[1]  job hash   <prefix>:job:<id>

    ARGV[1]  lease token the job must hold
    ARGV[2]  the entry (JSON object)
    ARGV[3]  its kind
    ARGV[4]  its id
    ARGV[5]  how many entries a ledger may hold

  Output: {'ok', 'added' | 'known'} | {'missing' | 'lease' | 'full', current state}
]]

local r = redis.call('HMGET', KEYS[1], 'state', 'lease', 'ledger')
if not r[1] then return {'missing', ''} end
if r[2] ~= ARGV[1] then return {'lease', r[1]} end
local list = (r[3] and r[3] ~= '') and cjson.decode(r[3]) or {}
for _, e in ipairs(list) do
  if e.kind == ARGV[3] and e.id == ARGV[4] then return {'ok', 'known'} end
end
if #list >= tonumber(ARGV[5]) then return {'full', r[1]} end
list[#list + 1] = cjson.decode(ARGV[2])
redis.call('HSET', KEYS[1], 'ledger', cjson.encode(list))
return {'ok', 'added'}
