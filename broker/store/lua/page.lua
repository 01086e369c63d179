-- One page of a listing: the next members after a keyset position, and their rows.
--
-- KEYS: 1 the index (a sorted set ordered by member), 2 rows hash
-- ARGV: 1 lower bound for ZRANGE BYLEX ("-" or "(<member>"), 2 how many to read
-- Returns {members, rows} with rows[i] the row JSON of members[i] (false if missing).
local members = redis.call('ZRANGE', KEYS[1], ARGV[1], '+', 'BYLEX', 'LIMIT', 0, ARGV[2])
if #members == 0 then
  return {members, {}}
end
local ids = {}
for i, member in ipairs(members) do
  ids[i] = string.sub(member, string.find(member, ':', 1, true) + 1)
end
return {members, redis.call('HMGET', KEYS[2], unpack(ids))}
