#!/usr/bin/env bash
# Runs a command with REDIS_ADDR pointing at a Redis. When REDIS_ADDR is already
# set it is used as is; otherwise a throwaway redis-server is started on a free
# loopback port (installed with apt-get if the binary is missing) and stopped
# when the command ends.
set -euo pipefail

if [ -n "${REDIS_ADDR:-}" ]; then
  exec "$@"
fi

if ! command -v redis-server >/dev/null 2>&1; then
  echo "with-redis: redis-server not found; installing it with apt-get" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null && apt-get install -y -qq redis-server >/dev/null
fi

free_port() {
  local p
  for _ in $(seq 1 200); do
    p=$(( 20000 + RANDOM % 30000 ))
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
      echo "$p"; return 0
    fi
  done
  echo "with-redis: no free port found" >&2; return 1
}

dir=$(mktemp -d)
port=$(free_port)
redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no \
  --dir "$dir" --logfile "$dir/redis.log" --daemonize yes --pidfile "$dir/redis.pid"
cleanup() {
  if [ -f "$dir/redis.pid" ]; then kill "$(cat "$dir/redis.pid")" 2>/dev/null || true; fi
  sleep 0.2; rm -rf "$dir"
}
trap cleanup EXIT
for _ in $(seq 1 100); do
  redis-cli -p "$port" ping >/dev/null 2>&1 && break
  sleep 0.05
done
redis-cli -p "$port" ping >/dev/null || { echo "with-redis: redis-server did not start:" >&2; cat "$dir/redis.log" >&2; exit 1; }
echo "with-redis: redis-server $(redis-server --version | awk '{print $3}') on 127.0.0.1:$port" >&2
export REDIS_ADDR="127.0.0.1:$port"
"$@"
