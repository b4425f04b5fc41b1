-- The per-state indexes and counters for a job that leaves `prev` (nil on create) for `to`: only the net move,
-- so a call that walks several states touches each index once. `K` names the keys (from KEYS), `j` the job's
-- fields read at the start (queue, priority, seq, started_at), `set` collects the fields to write in one HSET.
-- STATES, TERMINAL, WAITING, UNTIMED, DURATION_BUCKETS and the STAT_ field names come from the generated "rules"
-- include (queue/scripts.ts).
-- Counters kept: queued jobs per queue and priority (one field `<queue>|<priority>`: GET /queue's per-queue
-- and per-priority figures both add up from it); per-state totals are the indexes' sizes, and the jobs a queue
-- has ASSIGNED or RUNNING are read from those (small) indexes, so neither needs a counter of its own.
local function stateKeys(first)
  local t = {}
  for i, s in ipairs(STATES) do t[s] = KEYS[first + i - 1] end
  return t
end

local function moveIndexes(K, id, j, prev, to, nowms, set)
  if prev == to then return end
  local queued = (j.queue or '') .. '|' .. (j.priority or '')
  if prev then
    redis.call('ZREM', K.state[prev], id)
    if prev == WAITING then redis.call('HINCRBY', K.queued, queued, -1) end
  end
  redis.call('ZADD', K.state[to], j.seq, id)
  if to == WAITING then redis.call('HINCRBY', K.queued, queued, 1) end
  if TERMINAL[to] then
    set.finished_at = nowms
    -- By finish time, for the retention sweep (removeJob).
    redis.call('ZADD', K.finished, nowms, id)
    if j.started_at and not UNTIMED[to] then
      -- One field per outcome and bucket (not cumulative), which also counts the outcome: queue/metrics.ts adds
      -- them up at scrape time (durationHistogram, finishedTotals).
      local d = (nowms - tonumber(j.started_at)) / 1000
      local bucket = '+Inf'
      for _, b in ipairs(DURATION_BUCKETS) do
        if d <= b then bucket = tostring(b) break end
      end
      redis.call('HINCRBY', K.stats, STAT_DURATION_IN .. bucket .. ':' .. string.lower(to), 1)
      redis.call('HINCRBYFLOAT', K.stats, STAT_DURATION_SUM, d)
    else
      redis.call('HINCRBY', K.stats, STAT_TOTAL .. string.lower(to), 1)
    end
  end
end

-- The caller's fields (a decoded JSON object; null = delete) with the script's own (`set`) as one HSET, and one
-- HDEL of `present`: the null fields the record has (the script read them with its first HMGET, so a field that
-- is not there costs no command).
local function writeFields(job, fields, set, present)
  for k, v in pairs(fields) do
    if v ~= cjson.null and v ~= false then set[k] = tostring(v) end
  end
  local flat = {}
  for k, v in pairs(set) do flat[#flat + 1] = k; flat[#flat + 1] = v end
  if #flat > 0 then redis.call('HSET', job, unpack(flat)) end
  local del = {}
  for _, k in ipairs(present) do
    if set[k] == nil then del[#del + 1] = k end
  end
  if #del > 0 then redis.call('HDEL', job, unpack(del)) end
end

-- The names of the null fields of a caller's fields.
local function nullFields(fields)
  local out = {}
  for k, v in pairs(fields) do
    if v == cjson.null or v == false then out[#out + 1] = k end
  end
  return out
end
