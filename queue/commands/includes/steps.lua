-- The transition table's check of a walk: from `from` through the n states ARGV[first], ARGV[first + stride],
-- ... (createJob's steps are (state, reason), transitionJob's (state, reason, worker id)). Returns the state the
-- walk ends in, or nil when a step is not allowed. Both commands then answer {'conflict', the job's current state}
-- (createJob: '' as nothing was created). TRANSITIONS comes from the generated "rules" include.
local function checkSteps(from, n, first, stride)
  local s = from
  for i = 0, n - 1 do
    local to = ARGV[first + i * stride]
    if not TRANSITIONS[s][to] then return nil end
    s = to
  end
  return s
end
