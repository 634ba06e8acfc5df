-- leave_token leaves "~<token>" in the emptied holders key h for a second:
-- the plain form's record of the last token after a release in the sorted
-- set (which remembers its released holders in P{K}:d), read by promote and
-- plain_acquire.lua.
local function leave_token(h, token)
  redis.call('SET', h, '~' .. token, 'PX', 1000)
end

-- keep_release: before the plain form's record v in h is replaced, a plain
-- release's ("~<token>.", see plain_release.lua) moves into a key of its own,
-- P{K}:d:<token> (same hash slot as h, "P{K}:h"), for the rest of its life,
-- so that a repeat of that release still finds it.
local function keep_release(h, v)
  local token = string.match(v, '^~(%d+)%.$')
  if token then
    local left = redis.call('PTTL', h)
    if left > 0 then
      redis.call('SET', string.sub(h, 1, -3) .. ':d:' .. token, '1', 'PX', left)
    end
  end
end

-- promote turns a holders key in its plain form (see plain_acquire.lua)
-- into the sorted set the other scripts use: its holder becomes a member
-- scored by its expiry; a record of the last token is dropped, a plain
-- release's kept (keep_release). The fence key is raised to the token, so
-- later tokens stay greater. The scripts that change the holders key call
-- it first.
local function promote(h, fence)
  local v = redis.pcall('GET', h)
  if type(v) ~= 'string' then
    return
  end
  local left = redis.call('PTTL', h)
  keep_release(h, v)
  redis.call('DEL', h)
  local token = string.match(v, '^~?(%d+)')
  if token and tonumber(redis.call('GET', fence) or '0') < tonumber(token) then
    redis.call('SET', fence, token, 'PX', 1000)
  end
  if string.byte(v) ~= 126 and left > 0 then
    local t = redis.call('TIME')
    local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    redis.call('ZADD', h, now + left, v)
    redis.call('PEXPIRE', h, left)
  end
end

-- is_reservation tells whether the holder m ("<token>:<acquire id>:...") is
-- a reservation (AcquireOptions.Reserve, Lease.Reserve, a release's for a
-- parked job: release_park.lua), and is_final whether it is a final
-- Coalesce call's run (acquire_coalesce.lua): their acquire ids start with
-- "r" and "z", the one state a holder carries in its member, which the
-- scripts of every version read (see reservedMember in lease.go).
local function is_reservation(m)
  return string.find(m, '^%d+:r') ~= nil
end

local function is_final(m)
  return string.find(m, '^%d+:z') ~= nil
end
