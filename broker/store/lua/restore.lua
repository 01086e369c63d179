-- Bring part of an archived log back into Redis; the last part ends the restore.
--
-- KEYS: 1 log stream, 2 snapshot hash, 3 the partition's hot set, 4 metadata hash
-- ARGV: 1 the snapshot's ``gen`` the archive was read under, 2 now (ms), 3 the hot set
--       member, 4 "1" on the last part, 5 n, then n (field, value) pairs of the window
--       folded from the whole log (``w:*``, set by the last part: the archive left them
--       out), then (seq, ts, event JSON) triples in seq order
-- Entries already in the stream are skipped, so two restorers racing, or one that died
-- half-way and is retried, add each entry once. Until the last part clears
-- ``archived`` readers keep reading the archive and appends keep being refused.
-- Returns 1 (done or part added), 0 (not archived any more, or archived again since).
local log, snap, hot = KEYS[1], KEYS[2], KEYS[3]
local head = redis.call('HMGET', snap, 'archived', 'gen')
if not head[1] or head[2] ~= ARGV[1] then
  return 0
end
local last = 0
local top = redis.call('XREVRANGE', log, '+', '-', 'COUNT', 1)
if top[1] then
  last = tonumber(string.match(top[1][1], '^(%d+)'))
end
local pairs_ = tonumber(ARGV[5])
for i = 6 + 2 * pairs_, #ARGV, 3 do
  local seq = tonumber(ARGV[i])
  if seq > last then
    redis.call('XADD', log, seq .. '-0', 'ts', ARGV[i + 1], 'ev', ARGV[i + 2])
    last = seq
  end
end
if ARGV[4] == '1' then
  if last ~= tonumber(head[1]) then
    return redis.error_reply('ERR restore ended at ' .. last .. ' of ' .. head[1])
  end
  -- The user metadata the archive moved into the snapshot (``m:<name>``) goes back.
  if KEYS[4] then
    local fields = redis.call('HGETALL', snap)
    for i = 1, #fields, 2 do
      if string.sub(fields[i], 1, 2) == 'm:' then
        redis.call('HSET', KEYS[4], string.sub(fields[i], 3), fields[i + 1])
        redis.call('HDEL', snap, fields[i])
      end
    end
  end
  for i = 6, 5 + 2 * pairs_, 2 do
    redis.call('HSET', snap, ARGV[i], ARGV[i + 1])
  end
  redis.call('HDEL', snap, 'archived', 'archivedFence')
  redis.call('ZADD', hot, ARGV[2], ARGV[3])
end
return 1
