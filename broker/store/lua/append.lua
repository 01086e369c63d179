-- Append one event to a session's log, atomically with everything it implies:
-- the next seq, the stream entry <seq>-0, the snapshot, the partition's change
-- feed and the live event on the session's shard channel.
--
-- KEYS: 1 log stream, 2 snapshot hash, 3 metadata hash, 4 partition feed stream,
--       5 live shard channel (declared so that Cluster checks its slot too),
--       6 the partition's hot set (sessions whose log is in Redis, by last append),
--       7 the partition's deleted set (deleted sessions, by deletion time)
-- ARGV: 1 now (ms), 2 event body (JSON text, stored and published verbatim),
--       3 mode ("create" or "append"), 4 epoch (create only), 5 fencing token ("" = none),
--       6 feed max length, 7 tenant, 8 session id, 9 number of snapshot operations,
--       10 "1" if the event is activity (moves updatedAt), 11 the call's id (12 hex
--       digits; the same call made again, once applied, appends nothing and returns the
--       session's position), 12 the most events a session may have (0: no bound),
--       13 "1" if the event deletes the session, 14 "1" if it changes nothing the session
--       index shows but the seq and (activity) updatedAt, 15 the floor: the highest seq
--       the appender knows this log reached ("0": none), then the snapshot operations,
--       (op, field, value) triples:
--         set/del  a snapshot field;  mset/mdel  a metadata key;  mclear  all metadata.
-- Returns {seq, epoch}, or {seq, epoch, stored seq} when a floor (this one, or the one
-- lua/floor.lua left in the snapshot) was past the stored seq (the log was rewound: see
-- below), or an error reply: NOSESSION, EXISTS, FENCED, ARCHIVED (the log is in the
-- archive store: restore it, then append again), LIMIT (the session is full).
-- The first write is an HSET (create) or the log's XADD, so a Redis at maxmemory refuses
-- the script before it changes anything.
local log, snap, meta, feed, channel = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local hot, deleted = KEYS[6], KEYS[7]
local now, body, mode, call = ARGV[1], ARGV[2], ARGV[3], ARGV[11]
local RECENT_BYTES = 16 * 13  -- the last 16 calls' ids ("<12 hex>," each), newest first

-- What the checks below read, in one call: the last calls' ids, seq, epoch, fence,
-- whether the log is archived, and the floor a watcher left (an HGET or HEXISTS each was a
-- third of the script's calls, and each call costs Redis about a microsecond before it
-- does anything).
local head = redis.call('HMGET', snap, 'calls', 'seq', 'epoch', 'fence', 'archived', 'floor')
local recent = head[1] or ''

-- A call whose reply was lost (a connection cut, a failover) is sent again by its
-- client: if it was applied, it is answered with the session's position (at or past
-- the one it got) and appends nothing.
if call ~= '' and string.find(recent, call .. ',', 1, true) then
  return {tonumber(head[2]), head[3]}
end

local epoch, seq, rewound
if mode == 'create' then
  if redis.call('EXISTS', snap) == 1 then
    return redis.error_reply('EXISTS session already exists')
  end
  epoch = ARGV[4]
  redis.call('HSET', snap, 'epoch', epoch, 'seq', 0, 'created', now,
             'tenant', ARGV[7], 'sid', ARGV[8])
  seq = 1
else
  epoch = head[3]
  if not epoch then
    return redis.error_reply('NOSESSION no such session')
  end
  if ARGV[5] ~= '' and head[4] ~= ARGV[5] then
    return redis.error_reply('FENCED the session is held by another agent host')
  end
  if head[5] then
    return redis.error_reply('ARCHIVED the session log is in the archive store')
  end
  -- A log behind the floor lost events its appender saw acknowledged (a failover to a
  -- replica that had not received them): the new event takes the seq after the floor, so
  -- that no seq is given to two events and a watcher that saw the lost ones skips nothing.
  -- The snapshot's own floor is one a watcher found the log behind (lua/floor.lua).
  local stored, floor = tonumber(head[2] or 0), tonumber(ARGV[15])
  if head[6] and tonumber(head[6]) > floor then
    floor = tonumber(head[6])
  end
  if floor > stored then
    rewound = stored
    seq = floor + 1
  else
    seq = stored + 1
  end
  local bound = tonumber(ARGV[12])
  if bound > 0 and seq > bound then
    return redis.error_reply('LIMIT the session has reached its limit of ' .. bound .. ' events')
  end
end

-- seq as text, made once (a number that an argument or a concatenation takes is printed
-- with sprintf each time).
local q = tostring(seq)

-- The entry first: should it be refused (an ID at or below the stream's last), nothing
-- has changed. Then seq, updatedAt and the calls' ids in one HSET (none of them a field
-- a snapshot operation sets).
redis.call('XADD', log, q .. '-0', 'ts', now, 'ev', body)
if rewound and head[6] then
  redis.call('HDEL', snap, 'floor')  -- the log is past it now
end
local fields = {'seq', q}
if ARGV[10] == '1' then
  fields[3], fields[4] = 'updated', now
end
if call ~= '' then
  fields[#fields + 1] = 'calls'
  fields[#fields + 1] = string.sub(call .. ',' .. recent, 1, RECENT_BYTES)
end
redis.call('HSET', snap, unpack(fields))

for i = 0, tonumber(ARGV[9]) - 1 do
  local op, field, value = ARGV[16 + 3 * i], ARGV[17 + 3 * i], ARGV[18 + 3 * i]
  if op == 'set' then
    redis.call('HSET', snap, field, value)
  elseif op == 'del' then
    redis.call('HDEL', snap, field)
  elseif op == 'mset' then
    redis.call('HSET', meta, field, value)
  elseif op == 'mdel' then
    redis.call('HDEL', meta, field)
  elseif op == 'mclear' then
    redis.call('DEL', meta)
  end
end

local member = ARGV[7] .. '\t' .. ARGV[8]
redis.call('ZADD', hot, now, member)
if ARGV[13] == '1' then
  redis.call('ZADD', deleted, now, member)
end

-- The notice: tenant, session, seq; and for an event the index shows nothing of but its
-- seq and updatedAt, 'u': the updatedAt it set (ms), or '' (none set), so that a projector
-- can patch the index without reading the snapshot. Readers ignore fields they do not know.
if ARGV[14] == '1' then
  redis.call('XADD', feed, 'MAXLEN', '~', ARGV[6], '*', 't', ARGV[7], 's', ARGV[8], 'q', q,
             'u', ARGV[10] == '1' and now or '')
else
  redis.call('XADD', feed, 'MAXLEN', '~', ARGV[6], '*', 't', ARGV[7], 's', ARGV[8], 'q', q)
end
redis.call('SPUBLISH', channel,
  '{"seq":' .. q .. ',"epoch":"' .. epoch .. '","ts":' .. now .. ',"event":' .. body .. '}')
if rewound then
  return {seq, epoch, rewound}
end
return {seq, epoch}
