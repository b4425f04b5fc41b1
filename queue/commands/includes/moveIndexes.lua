-- The per-state indexes and counters for a job that leaves `prev` (nil on create) for `to`: only the net move,
-- so a call that walks several states touches each index once. `K` names the keys (from KEYS), `j` the job's
-- fields read at the start (queue, priority, seq, started_at), `set` collects the fields to write in one HSET.
-- STATES, TERMINAL, QUEUE_COUNTED and DURATION_BUCKETS come from the generated "rules" include.
local function stateKeys(first)
  local t = {}
  for i, s in ipairs(STATES) do t[s] = KEYS[first + i - 1] end
  return t
end

local function moveIndexes(K, id, j, prev, to, nowms, set)
  if prev == to then return end
  if prev then
    redis.call('ZREM', K.state[prev], id)
    if QUEUE_COUNTED[prev] and j.queue then redis.call('HINCRBY', K.queueCounts, j.queue .. '|' .. prev, -1) end
    if prev == 'QUEUED' and j.priority then redis.call('HINCRBY', K.byPriority, j.priority, -1) end
  end
  redis.call('ZADD', K.state[to], j.seq, id)
  if QUEUE_COUNTED[to] and j.queue then redis.call('HINCRBY', K.queueCounts, j.queue .. '|' .. to, 1) end
  if to == 'QUEUED' and j.priority then redis.call('HINCRBY', K.byPriority, j.priority, 1) end
  if TERMINAL[to] then
    set.finished_at = nowms
    -- By finish time, for the retention sweep (removeJob).
    redis.call('ZADD', K.finished, nowms, id)
    redis.call('HINCRBY', K.stats, 'total:' .. string.lower(to), 1)
    if j.started_at and to ~= 'CANCELLED' then
      -- One bucket per job (not cumulative): queue/metrics.ts adds them up at scrape time.
      local d = (nowms - tonumber(j.started_at)) / 1000
      local bucket = '+Inf'
      for _, b in ipairs(DURATION_BUCKETS) do
        if d <= b then bucket = tostring(b) break end
      end
      redis.call('HINCRBY', K.stats, 'duration_in:' .. bucket, 1)
      redis.call('HINCRBYFLOAT', K.stats, 'duration_sum', d)
    end
  end
end

-- Caller fields as one HSET (and one HDEL for the null ones). `set` already holds the script's own fields.
local function writeFields(job, fieldsJson, set)
  local del = {}
  if fieldsJson ~= '' then
    for k, v in pairs(cjson.decode(fieldsJson)) do
      if v == cjson.null or v == false then
        if set[k] == nil then del[#del + 1] = k end
      else
        set[k] = tostring(v)
      end
    end
  end
  local flat = {}
  for k, v in pairs(set) do flat[#flat + 1] = k; flat[#flat + 1] = v end
  if #flat > 0 then redis.call('HSET', job, unpack(flat)) end
  if #del > 0 then redis.call('HDEL', job, unpack(del)) end
end
