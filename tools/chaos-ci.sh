#!/usr/bin/env bash
# make chaos-ci: the standalone seed, the Cluster seed and the checkers' own
# tests run side by side. Each has its own redis-server(s) on ports of its own
# (a server that finds its port taken is started on another), its own history
# directory (chaos/chaos-out/seed-<seed>, the tests' in temporary directories)
# and its own queue and key prefix; most of each run's time is spent waiting
# (the seed's enqueue phase, the drain, the quiet phase), so together they take
# about as long as the longest of them instead of the sum. Each one's output is
# kept and printed whole when all have ended, under a header with its exit
# status and time; the target fails if any of them failed.
#   chaos-ci.sh NAME 'COMMAND' [NAME 'COMMAND']...
set -uo pipefail
cd "$(dirname "$0")/.."

GO=${GO:-go}
# Install redis-server once, before the runs start (two apt-get at once would
# contend for dpkg's lock, and the tests skip without it).
if ! command -v redis-server >/dev/null 2>&1; then
	echo "installing redis-server"
	export DEBIAN_FRONTEND=noninteractive
	apt-get install -y -q redis-server >/dev/null || { apt-get update -q >/dev/null && apt-get install -y -q redis-server >/dev/null; } || exit 1
fi
# Compile the chaos program and its tests once, here, not in each run at the
# same time (go run and go test then only link, or find the binary cached).
(cd chaos && $GO list -export -test ./... >/dev/null) || exit 1

tmp=$(mktemp -d)
names=()
cmds=()
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
	rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

while [ $# -ge 2 ]; do
	i=${#names[@]}
	names+=("$1")
	cmds+=("$2")
	(
		start=$SECONDS
		sh -c "$2" </dev/null >"$tmp/$i.log" 2>&1
		rc=$?
		echo "$rc $((SECONDS - start))" >"$tmp/$i.rc"
	) &
	pids+=($!)
	shift 2
done
echo "chaos-ci: running ${names[*]} side by side"

failed=()
for i in "${!names[@]}"; do
	wait "${pids[$i]}"
	read -r rc secs <"$tmp/$i.rc" || { rc=1 secs='?'; }
	echo "=== chaos-ci: ${names[$i]}: exit $rc in $secs s: ${cmds[$i]}"
	cat "$tmp/$i.log"
	[ "$rc" = 0 ] || failed+=("${names[$i]} (exit $rc)")
done
pids=()
if [ ${#failed[@]} -gt 0 ]; then
	echo "=== chaos-ci: FAILED: ${failed[*]}"
	exit 1
fi
echo "=== chaos-ci: all passed"
