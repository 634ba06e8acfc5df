-- The Coalesce section of a release script (see release.lua, which names the
-- arguments and keys): a Coalesce
-- lease whose run succeeded records its token as the key's coverage, which
-- a Coalesce acquire that began before it reads (acquire_coalesce.lua).
-- KEYS[3] coalesce_key: STRING, the token of the last covering run, set
--         unless it holds a later one
-- ARGV[8] coalesce_for: how long to remember that this holder's run
--         succeeded (ms), 0 for no record
-- It replies nothing of its own.
-- @coalesce
if coalesce_for > 0 then
  local tok = tonumber(released)
  if tok > tonumber(redis.call('GET', coalesce_key) or '0') then
    redis.call('SET', coalesce_key, string.format('%d', tok), 'PX', coalesce_for)
  end
end
