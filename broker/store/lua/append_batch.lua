-- Several appends in one call: append.lua's body, made the function append_one(KEYS, ARGV)
-- (SessionLog puts it before this), applied to each event in turn.
--
-- Arguments layout 2: what is the same for the whole call comes once, not once an event
-- (hiredis packing ~1,400 arguments for 64 events was a third of the appender's CPU, and
-- Redis parses every one of them).
-- KEYS: append.lua's 7 keys for each event, one event after another
-- ARGV: 1 the number of events N, 2 now (ms), 3 feed max length, 4 the most events a
--       session may have once an update or prompt is in, 5 the same for any other event
--       (0: no bound), then for each event in turn: its body, fencing token ("" = none),
--       tenant, session id, call id, flags, floor (append.lua's ARGV[15]), number of
--       snapshot operations K, then its K (op, field, value) triples. Flags: four characters, "1" or "0": the event is
--       activity, deletes the session, is index-neutral, is bounded by ARGV[4] (else 5).
-- Returns, for each event, what append.lua returns for it ({seq, epoch} or an error).
local count, now, maxlen = tonumber(ARGV[1]), ARGV[2], ARGV[3]
local sub = string.sub
local results, key, arg = {}, 0, 6
for i = 1, count do
  local keys = {}
  for j = 1, 7 do
    keys[j] = KEYS[key + j]
  end
  local flags, ops = ARGV[arg + 5], tonumber(ARGV[arg + 7])
  -- append.lua's ARGV for this event (its header documents them).
  local args = {now, ARGV[arg], 'append', '', ARGV[arg + 1], maxlen, ARGV[arg + 2],
                ARGV[arg + 3], ops, sub(flags, 1, 1), ARGV[arg + 4],
                sub(flags, 4, 4) == '1' and ARGV[4] or ARGV[5], sub(flags, 2, 2),
                sub(flags, 3, 3), ARGV[arg + 6]}
  for j = 1, 3 * ops do
    args[15 + j] = ARGV[arg + 7 + j]
  end
  results[i] = append_one(keys, args)
  key, arg = key + 7, arg + 8 + 3 * ops
end
return results
