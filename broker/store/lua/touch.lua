-- Bring several sessions' index entries up to events that change nothing the index shows
-- but the seq and updatedAt (see is_index_neutral): each session's stored row gets its new
-- updatedAt, its version the new one, and its ACP listings' members move to the new
-- position. Nothing is rendered: the row's SessionInfo line is patched where it stands.
--
-- KEYS: for each session, its tenant's rows hash, versions hash, then its n ACP listings
-- ARGV: 1 the number of sessions; then for each session 6 + n arguments: session id, the
--       version it must hold ("" = none), the new version, the new updatedAt text ("" =
--       the row keeps its own: an explicit one), the new position, n, then the n old
--       positions (one per ACP listing key, in the same order)
-- Returns, for each session, 1 when written, 0 when its version is not the one given (or
-- its row is not in the two-line form): project it the full way.
local results, k, a = {}, 0, 1
local UPDATED = '"updatedAt":"'
for i = 1, tonumber(ARGV[1]) do
  local rows, versions, sid = KEYS[k + 1], KEYS[k + 2], ARGV[a + 1]
  local updated, position, n = ARGV[a + 4], ARGV[a + 5], tonumber(ARGV[a + 6])
  local row = nil
  if (redis.call('HGET', versions, sid) or '') == ARGV[a + 2] then
    row = redis.call('HGET', rows, sid)
  end
  local line = row and string.find(row, '\n', 1, true)
  if line and updated ~= '' then
    -- The first '"updatedAt":"' of the SessionInfo line is its own key: every key before
    -- it holds strings, in which a quote is escaped.
    local from, to = string.find(row, UPDATED, 1, true)
    local close = to and string.find(row, '"', to + 1, true)
    if close and close < line then
      row = string.sub(row, 1, to) .. updated .. string.sub(row, close)
      line = line + #updated - (close - to - 1)
    else
      line = nil
    end
  end
  if line then
    local info = string.sub(row, 1, line - 1)
    for j = 1, n do
      local at, listing = ARGV[a + 6 + j], KEYS[k + 2 + j]
      redis.call('ZREMRANGEBYLEX', listing, '[' .. at, '(' .. at .. '\2')
      -- Only the listing of every session carries the SessionInfo (index.carries_info); a
      -- cwd's holds bare positions.
      if string.sub(listing, -7) == ':ix:acp' then
        redis.call('ZADD', listing, 0, position .. '\1' .. info)
      else
        redis.call('ZADD', listing, 0, position)
      end
    end
    redis.call('HSET', rows, sid, row)
    redis.call('HSET', versions, sid, ARGV[a + 3])
    results[i] = 1
  else
    results[i] = 0
  end
  k, a = k + 2 + n, a + 6 + n
end
return results
