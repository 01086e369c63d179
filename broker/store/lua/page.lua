-- One page of a listing, as ACP session/list shows it: the rows' SessionInfo texts joined
-- by commas (the body of the reply's array), the page's last member and whether more follow.
--
-- KEYS: 1 the index (a sorted set ordered by member), 2 rows hash
-- ARGV: 1 lower bound for ZRANGE BYLEX ("-" or "(<member>"), 2 page size
-- Returns {text, last member, 1 if more follow else 0}; text is nil when a row is still in
-- the earlier one-object format, and then the page's rows come fourth (nil where missing).
local limit = tonumber(ARGV[2])
local members = redis.call('ZRANGE', KEYS[1], ARGV[1], '+', 'BYLEX', 'LIMIT', 0, limit + 1)
local more = 0
if #members > limit then
  members[#members] = nil
  more = 1
end
if #members == 0 then
  return {'', false, 0}
end
local ids = {}
for i, member in ipairs(members) do
  ids[i] = string.sub(member, string.find(member, ':', 1, true) + 1)
end
local rows = redis.call('HMGET', KEYS[2], unpack(ids))
local infos = {}
for i = 1, #members do
  local row = rows[i]
  if row then
    local newline = string.find(row, '\n', 1, true)
    if not newline then
      return {false, members[#members], more, rows}
    end
    infos[#infos + 1] = string.sub(row, 1, newline - 1)
  end
end
return {table.concat(infos, ','), members[#members], more}
