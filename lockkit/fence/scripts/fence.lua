-- The fencing that every write script of package fence starts with (it is
-- prepended to set.lua, hset.lua, del.lua, incrby.lua and xadd.lua): the
-- check of the writer's token against the fence of the key written, and the
-- record of a write that went through. Safe to run twice: a repeat of a
-- write that went through finds its record and returns its reply, also
-- after a newer token's write.
-- Every write script takes these 3 keys and 3 arguments, laid out by
-- Writer.write (fence.go), then its own arguments from ARGV[4]; they are
-- named here, once.
-- KEYS[1] data_key: the key written
-- KEYS[2] fence_key: STRING, the newest token written to data_key; no TTL
--         while data_key has none, else data_key's TTL plus linger, and
--         linger once data_key is gone; never shortened otherwise
-- KEYS[3] write_key: STRING, the reply of the write of this call (its id
--         is in the name), kept for the client's retry window
-- ARGV[1] token   the writer's fencing token, decimal, positive
-- ARGV[2] linger  ms
-- ARGV[3] window  ms: the client's retry window
-- A write script returns {1, reply} when the write went through (now or in
-- an earlier run of its call), {0, newest token} when the fence holds a
-- newer token: then nothing changed.
local data_key, fence_key, write_key = KEYS[1], KEYS[2], KEYS[3]
local token, linger, window = ARGV[1], tonumber(ARGV[2]), ARGV[3]

-- older reports whether the decimal token a is less than b, compared as
-- text: exact for every int64.
local function older(a, b)
  if #a ~= #b then
    return #a < #b
  end
  return a < b
end

-- refused returns nil when the write may go through, else the script's
-- reply: an earlier run's of this call, or {0, newest token}.
local function refused()
  local done = redis.call('GET', write_key)
  if done then
    return {1, done}
  end
  local newest = redis.call('GET', fence_key)
  if newest and older(token, newest) then
    return {0, newest}
  end
  return nil
end

-- applied keeps the token in the fence and reply in write_key, and returns
-- the script's reply.
local function applied(reply)
  reply = tostring(reply)
  local ttl = redis.call('PTTL', data_key)
  if ttl == -1 then
    redis.call('SET', fence_key, token)
  else
    local keep = math.max(ttl, 0) + linger
    redis.call('SET', fence_key, token, 'PX', math.max(keep, redis.call('PTTL', fence_key)))
  end
  redis.call('SET', write_key, reply, 'PX', window)
  return {1, reply}
end
