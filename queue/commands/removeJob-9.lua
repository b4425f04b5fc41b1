--[[
  Removes one finished job for the retention sweep: its record, events, stored credentials and (older layout)
  history list, its place in every index, so listings and counts stay in agreement, and its ownership of what it
  made (includes/made.lua: with the ledger gone, nothing may remove those any more). A job that is not
  finished (the finished index is stale) only leaves the finished index. Per-queue counters hold queued jobs
  only, and the statistics are Prometheus counters: neither changes. Callers: JobStore.purgeFinished
  (queue/store.ts), which reads the candidate ids from KEYS[5] and sends one call per job in a pipeline
  <- the gateway's retention sweep.

  Input:
    KEYS[1]     job hash                       <prefix>:job:<id>
    KEYS[2]     job's progress events (stream) <prefix>:job:<id>:events
    KEYS[3]     job's stored credentials       <prefix>:job:<id>:credentials
    KEYS[4]     job's history list (the layout before the history field) <prefix>:job:<id>:history
    KEYS[5]     finished jobs by time (zset)   <prefix>:jobs:finished
    KEYS[6..8]  the terminal states' indexes, in TERMINAL order   <prefix>:jobs:state:<STATE>
    KEYS[9]     owners of what jobs made (hash) <prefix>:made-owners

    ARGV[1]  job id

  Output: 1 when removed, 0 when the job is not finished
]]
--- @include "rules"
--- @include "includes/made"

local id = ARGV[1]
local st = redis.call('HGET', KEYS[1], 'state')
redis.call('ZREM', KEYS[5], id)
if st and not TERMINAL[st] then return 0 end
if st then
  for i, s in ipairs(TERMINAL_LIST) do
    if s == st then redis.call('ZREM', KEYS[5 + i], id) end
  end
end
for _, e in ipairs(ledgerOf(KEYS[1])) do
  local f = madeField(e)
  if redis.call('HGET', KEYS[9], f) == id then redis.call('HDEL', KEYS[9], f) end
end
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4])
return 1
