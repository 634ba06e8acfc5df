-- Removes one entry of a key's parked queue (acquire_park.lua): the job it
-- names gives its place up, its work done without its running. Safe to run
-- twice: a removed entry is gone.
-- KEYS[1] parked_key: ZSET of parked jobs "<hold ms>:<label>:<id>"
-- ARGV[1] entry      the job's entry
-- Returns 1 when the entry was removed, 0 when it was not queued.
return redis.call('ZREM', KEYS[1], ARGV[1])
