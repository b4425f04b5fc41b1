-- Who owns each thing Ferry made on a target: the hash <prefix>:made-owners maps a field naming it (kind, host
-- URI and id, one per line) to the job whose ledger made it last. A dir pool's volume key is its path, which a
-- later job can make again once the first volume is gone, so a ledger entry alone does not prove the volume on
-- disk is that job's: rollback, cancel clean-up and retries remove an entry only while its job owns it, and give
-- the ownership up once it is removed (releaseMade-1.lua).
local function madeField(e)
  return tostring(e.kind) .. '\n' .. tostring(e.virt_uri) .. '\n' .. tostring(e.id)
end

local function ledgerOf(hash)
  local raw = redis.call('HGET', hash, 'ledger')
  return (raw and raw ~= '') and cjson.decode(raw) or {}
end
