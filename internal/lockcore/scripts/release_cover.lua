-- The Coalesce section of a release script (see release.lua): a Coalesce
-- lease whose run succeeded records its token as the key's coverage, which
-- a Coalesce acquire that began before it reads (acquire_coalesce.lua).
-- KEYS[3] cover: STRING, the token of the last covering run, set unless it
--         holds a later one
-- ARGV[8] how long to remember that this holder's run succeeded (ms), "0"
--         for no record
-- It replies nothing of its own.
-- @cover
local cover = tonumber(ARGV[8])
if cover > 0 then
  local tok = tonumber(released)
  if tok > tonumber(redis.call('GET', KEYS[3]) or '0') then
    redis.call('SET', KEYS[3], string.format('%d', tok), 'PX', cover)
  end
end
