-- Take, keep or give up the lease on a session; taking it bumps the fencing token.
--
-- KEYS: 1 lease key, 2 snapshot hash
-- ARGV: 1 op ("acquire" | "renew" | "release"), 2 host id, 3 ttl (ms)
-- acquire: {1, fence} when this host now holds the lease (a new fence if it was free),
--          {0, holder} when another host holds it; error NOSESSION if there is no session.
-- renew / release: 1 if this host held the lease, else 0.
local lease, snap, op, host = KEYS[1], KEYS[2], ARGV[1], ARGV[2]
local holder = redis.call('GET', lease)
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
if holder ~= host then
  return 0
end
if op == 'renew' then
  redis.call('PEXPIRE', lease, ARGV[3])
else
  redis.call('DEL', lease)
end
return 1
