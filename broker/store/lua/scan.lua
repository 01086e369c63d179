-- The next members of several listings, each after its own keyset position, with their rows.
--
-- KEYS: 1 rows hash, then one index (a sorted set ordered by member) per listing
-- ARGV: per listing, in KEYS order: the lower bound for ZRANGE BYLEX ("-" or "(<member>")
--       and how many members to read
-- Returns, per listing, two arrays: its members, and their rows (false where a row is missing).
local out = {}
for i = 2, #KEYS do
  local low, count = ARGV[2 * i - 3], ARGV[2 * i - 2]
  local members = redis.call('ZRANGE', KEYS[i], low, '+', 'BYLEX', 'LIMIT', 0, count)
  local rows = {}
  if #members > 0 then
    local ids = {}
    for j, member in ipairs(members) do
      ids[j] = string.sub(member, string.find(member, ':', 1, true) + 1)
    end
    rows = redis.call('HMGET', KEYS[1], unpack(ids))
  end
  out[#out + 1] = members
  out[#out + 1] = rows
end
return out
