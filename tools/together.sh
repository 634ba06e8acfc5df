#!/usr/bin/env bash
# Runs commands side by side and reports each: together.sh LABEL NAME 'COMMAND'
# [NAME 'COMMAND']... Each command runs with sh -c, no standard input, its
# output kept and printed whole once all have ended, under a header with its
# exit status and time; the script fails if any of them failed. For suites
# that spend most of their time waiting (a chaos seed's drain, cron ticks,
# asynq's polls), so that together they take about as long as the longest.
set -uo pipefail
# Job control: each command runs in a process group of its own, so that an
# interrupted run stops the commands' children too.
set -m
if [ $# -lt 3 ] || [ $(($# % 2)) -ne 1 ]; then
	echo "usage: together.sh LABEL NAME 'COMMAND' [NAME 'COMMAND']..." >&2
	exit 2
fi
label=$1
shift
tmp=$(mktemp -d)
names=()
cmds=()
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill -- "-$p" 2>/dev/null; done
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
echo "$label: running ${names[*]} side by side"

failed=()
for i in "${!names[@]}"; do
	wait "${pids[$i]}"
	read -r rc secs <"$tmp/$i.rc" || { rc=1 secs='?'; }
	echo "=== $label: ${names[$i]}: exit $rc in $secs s: ${cmds[$i]}"
	cat "$tmp/$i.log"
	[ "$rc" = 0 ] || failed+=("${names[$i]} (exit $rc)")
done
pids=()
if [ ${#failed[@]} -gt 0 ]; then
	echo "=== $label: FAILED: ${failed[*]}"
	exit 1
fi
echo "=== $label: all passed"
