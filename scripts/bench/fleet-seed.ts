// The finished jobs of scripts/bench/fleet.ts. The first ones are made through the real Lua scripts (JobStore:
// common.ts makeFinishedJob); the rest are copies of the last of those, made inside Redis, because on a machine
// shared with others 100,000 jobs through the scripts take 20 minutes (80 jobs/s at load 40) where the copies
// take seconds. A copy is what the real job left, with the template's id replaced by the copy's: every key whose
// name holds the id (the record, the event stream), with the id replaced in every value too, and the template's
// place in every index that holds it (sorted sets with its score, sets, hashes keyed by id). Counters are not
// per job and are not copied (the finished totals of /metrics count the jobs made through the scripts only).
// This runs only on the bench's private Redis: the script reaches keys it was not passed in KEYS.
import type { RedisClient } from '../../platform/redis';

const CLONE = `
local function replace(s, a, b)
  local out, i = {}, 1
  while true do
    local j, k = string.find(s, a, i, true)
    if not j then break end
    out[#out + 1] = string.sub(s, i, j - 1) .. b
    i = k + 1
  end
  out[#out + 1] = string.sub(s, i)
  return table.concat(out)
end
local tmpl, base, from, to = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local own = cjson.decode(ARGV[5])   -- {{key, type}}: keys whose name holds the template's id
local idx = cjson.decode(ARGV[6])   -- {{key, type, score-or-value}}: indexes that hold the id as a member or field
local data = {}
for n, o in ipairs(own) do
  if o[2] == 'hash' then data[n] = redis.call('HGETALL', o[1])
  elseif o[2] == 'stream' then data[n] = redis.call('XRANGE', o[1], '-', '+')
  elseif o[2] == 'string' then data[n] = redis.call('GET', o[1]) end
end
for i = from, to - 1 do
  local id = base .. i
  for n, o in ipairs(own) do
    local key = replace(o[1], tmpl, id)
    if o[2] == 'hash' then
      local args = {}
      for f = 1, #data[n] do args[f] = replace(data[n][f], tmpl, id) end
      redis.call('HSET', key, unpack(args))
    elseif o[2] == 'stream' then
      for _, e in ipairs(data[n]) do
        local fv = {}
        for f = 1, #e[2] do fv[f] = replace(e[2][f], tmpl, id) end
        redis.call('XADD', key, e[1], unpack(fv))
      end
    elseif o[2] == 'string' then redis.call('SET', key, replace(data[n], tmpl, id)) end
  end
  for _, x in ipairs(idx) do
    if x[2] == 'zset' then redis.call('ZADD', x[1], x[3], id)
    elseif x[2] == 'set' then redis.call('SADD', x[1], id)
    elseif x[2] == 'hash' then redis.call('HSET', x[1], id, replace(x[3], tmpl, id)) end
  end
end
return to - from
`;

/** Where the template job `tmpl` lives: keys named after it, and indexes holding it. */
async function layoutOf(rc: RedisClient, tmpl: string) {
  const own: [string, string][] = [];
  const idx: [string, string, string][] = [];
  let cursor = '0';
  do {
    const [next, keys] = await rc.scan(cursor, 'COUNT', 2000);
    cursor = next;
    for (const k of keys) {
      const type = await rc.type(k);
      if (k.includes(tmpl)) { own.push([k, type]); continue; }
      if (type === 'zset') { const s = await rc.zscore(k, tmpl); if (s !== null) idx.push([k, type, s]); }
      else if (type === 'set') { if (await rc.sismember(k, tmpl)) idx.push([k, type, '']); }
      else if (type === 'hash') { const v = await rc.hget(k, tmpl); if (v !== null) idx.push([k, type, v]); }
    }
  } while (cursor !== '0');
  if (!own.length) throw new Error(`template job ${tmpl}: no key holds its id`);
  return { own, idx };
}

/** Copies of the finished job `tmpl` as `${base}${from}` .. `${base}${to - 1}`, 500 per script call. */
export async function cloneFinished(rc: RedisClient, tmpl: string, base: string, from: number, to: number) {
  const { own, idx } = await layoutOf(rc, tmpl);
  for (let i = from; i < to; i += 500) {
    await rc.eval(CLONE, 0, tmpl, base, String(i), String(Math.min(to, i + 500)), JSON.stringify(own), JSON.stringify(idx));
  }
  return { own: own.map(([k]) => k), idx: idx.map(([k]) => k) };
}
