--[[
  Records an output a job's attempt created (its identity, platform/roots.ts outputId), under the attempt's lease, so
  a retry on any worker recognises the file as the job's own and may replace it. The list keeps the newest 64.
  Callers: JobStore.recordOutput (queue/store.ts) <- the worker's output claims (services/worker/runner.ts).

  Input:
    KEYS[1]  job hash   <prefix>:job:<id>

    ARGV[1]  lease token the job must hold
    ARGV[2]  the output's identity
    ARGV[3]  how many identities are kept

  Output: {'ok', ''} | {'missing' | 'lease', current state}
]]

local r = redis.call('HMGET', KEYS[1], 'state', 'lease', 'owned_outputs')
if not r[1] then return {'missing', ''} end
if r[2] ~= ARGV[1] then return {'lease', r[1]} end
local list = (r[3] and r[3] ~= '') and cjson.decode(r[3]) or {}
list[#list + 1] = ARGV[2]
local keep, out = tonumber(ARGV[3]), {}
for i = math.max(1, #list - keep + 1), #list do out[#out + 1] = list[i] end
redis.call('HSET', KEYS[1], 'owned_outputs', cjson.encode(out))
return {'ok', ''}
