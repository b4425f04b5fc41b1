--[[
  Gives up a lease of periodic work when its holder stops (a clean shutdown hands over at once instead of after
  the lease's expiry), only while the holder still has it. Callers: Leader.stop (queue/leader.ts).

  Input:
    KEYS[1]  the lease   <prefix>:leader:<group>

    ARGV[1]  the holder's value, `<holder>#<fence>`

  Output: 1 when dropped, 0 when another process (or a later fence) holds it
]]

if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
