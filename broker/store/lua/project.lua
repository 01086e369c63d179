-- Write one session's row and index entries, if nobody changed them since we read.
--
-- KEYS: 1 rows hash, 2 versions hash, then n_old old index keys, then the new index keys
-- ARGV: 1 session id, 2 the version we read ("" = none), 3 new version, 4 row JSON
--       ("" = remove the session from the index),
--       5 n_old, then the n_old old positions, then one member per new index key
-- An old entry goes with every member stored at its position: the bare position, or the
-- position followed by \1 and the SessionInfo (an ACP listing's, see index.py); no other
-- member lies between the position and the position followed by \2.
-- Returns 1 when written, 0 when the stored version changed under us (read again).
local rows, versions, sid = KEYS[1], KEYS[2], ARGV[1]
if (redis.call('HGET', versions, sid) or '') ~= ARGV[2] then
  return 0
end
local n_old = tonumber(ARGV[5])
for i = 1, n_old do
  local at = ARGV[5 + i]
  redis.call('ZREMRANGEBYLEX', KEYS[2 + i], '[' .. at, '(' .. at .. '\2')
end
for i = 3 + n_old, #KEYS do
  redis.call('ZADD', KEYS[i], 0, ARGV[3 + i])
end
if ARGV[4] == '' then
  redis.call('HDEL', rows, sid)
  redis.call('HDEL', versions, sid)
else
  redis.call('HSET', rows, sid, ARGV[4])
  redis.call('HSET', versions, sid, ARGV[3])
end
return 1
