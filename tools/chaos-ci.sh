#!/usr/bin/env bash
# make chaos-ci: the standalone seed, the Cluster seed, the checkers' own
# tests and the failover suite's Sentinel tests run side by side. Each has
# its own redis-server(s) on ports of its own (a server that finds its port
# taken is started on another), its own history
# directory (chaos/chaos-out/seed-<seed>, the tests' in temporary directories)
# and its own queue and key prefix; most of each run's time is spent waiting
# (the seed's enqueue phase, the drain, the quiet phase), so together they take
# about as long as the longest of them instead of the sum. Each one's output is
# kept and printed whole when all have ended, under a header with its exit
# status and time; the target fails if any of them failed.
#   chaos-ci.sh NAME 'COMMAND' [NAME 'COMMAND']...   (see together.sh)
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
(cd failover && $GO list -export -test ./... >/dev/null) || exit 1

exec tools/together.sh chaos-ci "$@"
