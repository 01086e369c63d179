-- Trim an archived log out of Redis, once its archive copy is confirmed written.
--
-- KEYS: 1 log stream, 2 snapshot hash, 3 the partition's hot set, 4 metadata hash
-- ARGV: 1 the seq the archive copy ends at, 2 its epoch, 3 the hot set member
-- Returns 1 (trimmed), 0 (already archived), -1 (the log moved on since the copy was
-- read: nothing is trimmed, the next round archives it again), or NOSESSION.
-- The snapshot's ``archived`` field (the archived seq) tells readers to read the archive
-- and the append script to refuse until the log is restored; ``gen`` counts trims so a
-- reader can tell that a trim happened while it read. HSET comes first: a Redis at
-- maxmemory refuses it before the log is touched.
local log, snap, hot = KEYS[1], KEYS[2], KEYS[3]
local MAX_META_FIELDS = 16  -- a snapshot has some 15 fields; a listpack holds up to 128
local MAX_META_BYTES = 62  -- hash-max-listpack-value (64) less the ``m:`` prefix
local head = redis.call('HMGET', snap, 'seq', 'epoch', 'archived')
if not head[1] then
  return redis.error_reply('NOSESSION no such session')
end
if head[3] then
  return 0
end
if head[1] ~= ARGV[1] or head[2] ~= ARGV[2] then
  return -1
end
redis.call('HSET', snap, 'archived', ARGV[1])
-- The fencing token the session's host (if any) holds now: renewing that lease gives it up
-- (lease.lua); a host that takes the session back later holds a newer token, and keeps it.
local fence = redis.call('HGET', snap, 'fence')
if fence then
  redis.call('HSET', snap, 'archivedFence', fence)
end
redis.call('HINCRBY', snap, 'gen', 1)
-- The recent call ids go too (208 bytes): a call retried after a lost reply comes back
-- within seconds, and a session is archived only after archive_after without appends.
redis.call('HDEL', snap, 'calls')
-- Written again whole, so that Redis stores it compactly: a hash turns from a listpack into
-- a hash table once a value outgrows hash-max-listpack-value (the call ids did) and never
-- turns back by itself. Archived sessions are most sessions; a listpack is a third the size.
-- The tenant and session id are left out: the key names them (readers are given them).
-- So is the window (``w:*``: the agent's modes, config options, models, JSON far over 64
-- bytes): it is a fold of the log's events, and ``SessionLog.restore`` folds it again.
local fields = redis.call('HGETALL', snap)
local kept = {}
for i = 1, #fields, 2 do
  local name = fields[i]
  if name ~= 'tenant' and name ~= 'sid' and string.sub(name, 1, 2) ~= 'w:' then
    kept[#kept + 1] = fields[i]
    kept[#kept + 1] = fields[i + 1]
  end
end
-- The user metadata goes into the snapshot too, each field as ``m:<name>`` (its own key
-- cost some 190 bytes of Redis, most of it the key), when it keeps the snapshot a listpack:
-- a few short fields. ``lua/restore.lua`` moves it back.
local meta = KEYS[4]
if meta then
  local pairs_ = redis.call('HGETALL', meta)
  local small = #pairs_ > 0 and #pairs_ <= 2 * MAX_META_FIELDS
  for i = 1, #pairs_ do
    small = small and string.len(pairs_[i]) <= MAX_META_BYTES
  end
  if small then
    for i = 1, #pairs_, 2 do
      kept[#kept + 1] = 'm:' .. pairs_[i]
      kept[#kept + 1] = pairs_[i + 1]
    end
    redis.call('DEL', meta)
  end
end
redis.call('DEL', snap)
redis.call('HSET', snap, unpack(kept))
redis.call('DEL', log)
redis.call('ZREM', hot, ARGV[3])
return 1
