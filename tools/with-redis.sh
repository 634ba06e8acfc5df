#!/usr/bin/env bash
# Runs a command with a Redis to test against:
#   REDIS_ADDR           a standalone server; when unset, a throwaway redis-server
#                        is started on a free loopback port.
#   REDIS_CLUSTER_ADDRS  comma-separated seeds of a Redis Cluster; when unset, a
#                        throwaway 3-master cluster is started on loopback ports
#                        (set JOBGUARD_NO_CLUSTER=1 to skip it).
# redis-server is installed with apt-get if the binary is missing. Everything
# started here is stopped when the command ends.
set -euo pipefail

need_server=0
[ -z "${REDIS_ADDR:-}" ] && need_server=1
need_cluster=0
[ -z "${REDIS_CLUSTER_ADDRS:-}" ] && [ -z "${JOBGUARD_NO_CLUSTER:-}" ] && need_cluster=1
if [ $need_server = 0 ] && [ $need_cluster = 0 ]; then
  exec "$@"
fi

if ! command -v redis-server >/dev/null 2>&1; then
  echo "with-redis: redis-server not found; installing it with apt-get" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null && apt-get install -y -qq redis-server >/dev/null
fi

dir=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do
    for _ in $(seq 1 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.05; done
  done
  rm -rf "$dir"
}
trap cleanup EXIT

port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# start_server PORT EXTRA-ARGS... : a redis-server in the background, no persistence.
start_server() {
  local port=$1; shift
  mkdir -p "$dir/$port"
  redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no \
    --dir "$dir/$port" --logfile "$dir/$port/redis.log" "$@" &
  pids+=($!)
  for _ in $(seq 1 100); do
    redis-cli -p "$port" ping >/dev/null 2>&1 && return 0
    sleep 0.05
  done
  echo "with-redis: redis-server on port $port did not start:" >&2
  cat "$dir/$port/redis.log" >&2
  return 1
}

# A base port with base..base+3 free (and base+10000.. for the cluster bus).
base=""
for _ in $(seq 1 200); do
  b=$(( 20000 + RANDOM % 400 * 5 ))  # bus ports (+10000) stay below the ephemeral range
  if port_free $b && port_free $((b+1)) && port_free $((b+2)) && port_free $((b+3)) \
     && port_free $((b+10001)) && port_free $((b+10002)) && port_free $((b+10003)); then
    base=$b; break
  fi
done
[ -n "$base" ] || { echo "with-redis: no free ports found" >&2; exit 1; }

if [ $need_server = 1 ]; then
  start_server "$base"
  export REDIS_ADDR="127.0.0.1:$base"
  echo "with-redis: redis-server $(redis-server --version | awk '{print $3}') at $REDIS_ADDR" >&2
fi

if [ $need_cluster = 1 ]; then
  seeds=()
  for i in 1 2 3; do
    p=$((base+i))
    start_server "$p" --cluster-enabled yes --cluster-config-file "$dir/$p/nodes.conf" --cluster-node-timeout 2000
    seeds+=("127.0.0.1:$p")
  done
  redis-cli --cluster create "${seeds[@]}" --cluster-replicas 0 --cluster-yes >"$dir/cluster-create.log" 2>&1 \
    || { echo "with-redis: redis-cli --cluster create failed:" >&2; cat "$dir/cluster-create.log" >&2; exit 1; }
  for _ in $(seq 1 200); do
    ok=1
    for s in "${seeds[@]}"; do
      redis-cli -p "${s##*:}" cluster info 2>/dev/null | grep -q 'cluster_state:ok' || ok=0
    done
    [ $ok = 1 ] && break
    sleep 0.05
  done
  [ $ok = 1 ] || { echo "with-redis: the cluster did not become ready" >&2; exit 1; }
  REDIS_CLUSTER_ADDRS=$(IFS=,; echo "${seeds[*]}")
  export REDIS_CLUSTER_ADDRS
  echo "with-redis: 3-master Redis Cluster at $REDIS_CLUSTER_ADDRS" >&2
fi

"$@"
