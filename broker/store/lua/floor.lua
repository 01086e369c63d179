-- Leave a floor in a session's snapshot: the highest seq a watcher was handed of a log now
-- found behind it (Redis lost acknowledged writes in a failover). The append script gives
-- the next event a seq past it, whoever appends (store/floors.py).
--
-- KEYS: 1 snapshot hash
-- ARGV: 1 the seq handed out, 2 the log's epoch it belongs to
-- Returns 1 (left), 0 (no such session, another epoch, or the log or its floor is at or
-- past it already).
local head = redis.call('HMGET', KEYS[1], 'seq', 'epoch', 'floor')
local floor = tonumber(ARGV[1])
if not head[1] or head[2] ~= ARGV[2] or tonumber(head[1]) >= floor
    or (head[3] and tonumber(head[3]) >= floor) then
  return 0
end
redis.call('HSET', KEYS[1], 'floor', floor)
return 1
