-- Several appends in one call: append.lua's body, made the function append_one(KEYS, ARGV)
-- (SessionLog puts it before this), applied to each event in turn.
--
-- KEYS: append.lua's 7 keys for each event, one event after another
-- ARGV: 1 the number of events N, 2 .. N+1 how many arguments each event has, then each
--       event's append.lua arguments, one event after another
-- Returns, for each event, what append.lua returns for it ({seq, epoch} or an error).
local count = tonumber(ARGV[1])
local results, key, arg = {}, 0, 1 + count
for i = 1, count do
  local argc = tonumber(ARGV[1 + i])
  local keys = {}
  for j = 1, 7 do
    keys[j] = KEYS[key + j]
  end
  local args = {}
  for j = 1, argc do
    args[j] = ARGV[arg + j]
  end
  results[i] = append_one(keys, args)
  key, arg = key + 7, arg + argc
end
return results
