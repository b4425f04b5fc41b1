--[[
  Takes or keeps the lease of a group of periodic work (the sweeps of every gateway, of every scheduler): one
  process holds it at a time, and each take gets a new fencing token, so a holder whose lease ran out (a pause, a
  partition) finds its value gone before its next sweep step. Callers: Leader.hold (queue/leader.ts), every
  third of the lease.

  Input:
    KEYS[1]  the lease (string, `<holder>#<fence>`, expires)   <prefix>:leader:<group>
    KEYS[2]  the fencing counter                                 <prefix>:leader:<group>:fence

    ARGV[1]  holder id (one per process)
    ARGV[2]  lease, ms

  Output: {'held', fence} (renewed) | {'taken', fence} (new lease) | {'other', the holder's value}
]]

local cur = redis.call('GET', KEYS[1])
if cur then
  local holder, fence = string.match(cur, '^(.*)#(%d+)$')
  if holder == ARGV[1] then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    return {'held', fence}
  end
  return {'other', cur}
end
local fence = redis.call('INCR', KEYS[2])
redis.call('SET', KEYS[1], ARGV[1] .. '#' .. fence, 'PX', ARGV[2])
return {'taken', tostring(fence)}
