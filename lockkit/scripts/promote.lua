-- leave_token leaves "~<token>" in the emptied holders key h for a second:
-- the plain form's record of the last token (see plain_release.lua), which
-- promote and plain_acquire.lua read.
local function leave_token(h, token)
  redis.call('SET', h, '~' .. token, 'PX', 1000)
end

-- promote turns a holders key in its plain form (see plain_acquire.lua)
-- into the sorted set the other scripts use: its holder becomes a member
-- scored by its expiry; a release record "~<token>" is dropped. When fence
-- is given, the fence key is raised to the token, so later tokens stay
-- greater. The scripts that change the holders key call it first.
local function promote(h, fence)
  local v = redis.pcall('GET', h)
  if type(v) ~= 'string' then
    return
  end
  local left = redis.call('PTTL', h)
  redis.call('DEL', h)
  local token = string.match(v, '^~?(%d+)')
  if fence and token and tonumber(redis.call('GET', fence) or '0') < tonumber(token) then
    redis.call('SET', fence, token, 'PX', 1000)
  end
  if string.byte(v) ~= 126 and left > 0 then
    local t = redis.call('TIME')
    local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    redis.call('ZADD', h, now + left, v)
    redis.call('PEXPIRE', h, left)
  end
end
