-- Take, keep or give up the lease on a session; taking it bumps the fencing token.
--
-- KEYS: 1 lease key, 2 snapshot hash
-- ARGV: 1 op ("acquire" | "renew" | "release"), 2 host id, 3 ttl (ms)
-- acquire: {1, fence} when this host now holds the lease (a new fence if it was free),
--          {0, holder} when another host holds it; error NOSESSION if there is no session.
-- renew / release: 1 if this host held the lease, else 0; renew: 2 (archived, see below),
-- or -1 when the lease and the session are both gone (the store lost its data: no other
-- host holds it).
-- renew with ARGV 4 (the fence this host holds) also takes back a lease that lapsed while
-- nobody else took it (the fence is unchanged): a Redis that stalled past the TTL, or came
-- back from its append-only file after it, does not take the session from a live host.
-- renew of a session archived while this host held it (idle for archive_after: its fence
-- is the one the archive recorded) gives the lease up instead and returns 2: the host lets
-- the session go, and the next command for it goes to the shared queue, where any host
-- takes it back (a newer fence: that lease is kept while the log is restored). A held
-- lease cost its key and an entry in the leases set, for every archived session.
local lease, snap, op, host = KEYS[1], KEYS[2], ARGV[1], ARGV[2]
local holder = redis.call('GET', lease)
if op == 'renew' and (not holder or holder == host) then
  local state = redis.call('HMGET', snap, 'archived', 'archivedFence', 'fence')
  if state[1] and state[2] and state[2] == state[3] then
    if holder then
      redis.call('DEL', lease)
    end
    return 2
  end
end
if op == 'renew' and not holder and ARGV[4] and ARGV[4] ~= '' then
  if redis.call('HGET', snap, 'fence') == ARGV[4] then
    redis.call('SET', lease, host, 'PX', ARGV[3])
    return 1
  end
end
if op == 'acquire' then
  if redis.call('EXISTS', snap) == 0 then
    return redis.error_reply('NOSESSION no such session')
  end
  if holder and holder ~= host then
    return {0, holder}
  end
  redis.call('SET', lease, host, 'PX', ARGV[3])
  if holder == host then
    return {1, redis.call('HGET', snap, 'fence') or '0'}
  end
  return {1, tostring(redis.call('HINCRBY', snap, 'fence', 1))}
end
if not holder and op == 'renew' and redis.call('EXISTS', snap) == 0 then
  return -1
end
if holder ~= host then
  return 0
end
if op == 'renew' then
  redis.call('PEXPIRE', lease, ARGV[3])
else
  redis.call('DEL', lease)
end
return 1
