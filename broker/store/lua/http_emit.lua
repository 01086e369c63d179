-- Append a Streamable HTTP connection's outgoing messages to its scopes' streams, fenced.
--
-- KEYS: 1 the connection's record (hash), 2 its holder key, 3.. one stream per message
-- ARGV: 1 the node that holds the connection, 2 retention (messages kept per stream),
--       3 idle ttl (ms), 4 the record's fields to set (JSON object, "" for none),
--       then per message: its scope and its text
-- Returns {cursor, reader, ...} per message (reader: the GET stream's node, or ""), or
-- false when this node no longer holds the connection (or the connection is gone): it
-- sends nothing more for it.
local record, holder_key, node = KEYS[1], KEYS[2], ARGV[1]
if redis.call('GET', holder_key) ~= node or redis.call('EXISTS', record) == 0 then
  return false
end
local keep, ttl = tonumber(ARGV[2]), tonumber(ARGV[3])
if ARGV[4] ~= '' then
  local fields = cjson.decode(ARGV[4])
  for name, value in pairs(fields) do
    redis.call('HSET', record, name, value)
  end
end
local out = {}
for i = 3, #KEYS do
  local scope, text = ARGV[5 + (i - 3) * 2], ARGV[6 + (i - 3) * 2]
  local n = redis.call('HINCRBY', record, 'n:' .. scope, 1)
  redis.call('XADD', KEYS[i], 'MAXLEN', '~', keep, n .. '-0', 'm', text)
  redis.call('PEXPIRE', KEYS[i], ttl)
  out[#out + 1] = n
  out[#out + 1] = redis.call('HGET', record, 'r:' .. scope) or ''
end
redis.call('PEXPIRE', record, ttl)
return out
