#!/usr/bin/env bash
# Runs the core tests at the newest versions of every dependency. The go.mod
# files require the lowest versions the tests pass with (the floors, which
# `make test` runs at); this copies the tree to a temporary directory, updates
# each module there with `go get -u`, prints the versions it got, and runs go
# vet and the lease core's tests (standalone Redis: REDIS_ADDR, or the server
# tools/with-redis.sh starts). Nothing in the checkout changes.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
go=${GO:-go}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
tar -C "$root" --exclude=.git --exclude=chaos/chaos-out -cf - . | tar -C "$tmp" -xf -
cd "$tmp"
for m in . gocronguard jobguardprom jobguardotel fencesql; do
	# Every direct requirement but the root module, which the integration
	# modules replace with this tree.
	(cd "$m" && "$go" mod tidy && "$go" get -u $("$go" list -m -f '{{if and (not .Main) (not .Indirect) (not .Replace)}}{{.Path}}{{end}}' all) &&
		"$go" mod tidy)
done
echo "newest versions:"
"$go" list -m all | grep -E 'go-redis|hibiken/asynq|robfig/cron|miniredis' | sed 's/^/  /'
for m in gocronguard jobguardprom jobguardotel fencesql; do
	(cd "$m" && "$go" list -m all | grep -E 'go-co-op/gocron|prometheus/client_golang|opentelemetry.io/otel |jackc/pgx' | sed "s|^|  $m: |")
done
"$go" vet ./...
# Standalone Redis only: the Cluster variants skip (CI=true would make a
# missing cluster a failure; make test runs them).
export CI= JOBGUARD_NO_CLUSTER=1
# What calls go-redis itself: lockkit and its packages, and singleton's
# own commands (the decision log's XADD, the state reads after a retry, the
# Client's TIME, ParkAtEnqueue's reads of asynq's keys) with asynq, whose
# newest is its floor v0.26.0, on the newest go-redis. middleware reaches
# Redis only through lockkit. make test runs all of singleton.
# The integration modules' tests (mostly waiting for cron ticks) run beside.
for m in gocronguard jobguardprom jobguardotel fencesql; do
	(cd "$m" && "$go" vet ./...)
done
GO=$go "$root/tools/together.sh" test-compat \
	'core' '"$GO" test -count=1 -timeout 5m ./lockkit/... ./internal/lockcore/... && "$GO" test -count=1 -timeout 5m -run "DecisionLog|LateRetryWrite|ParkAtEnqueue|ClientStamp|OneKeyForTheRetryWindow|Debounce" ./singleton/' \
	'integration modules' 'for m in gocronguard jobguardprom jobguardotel fencesql; do (cd $m && "$GO" test -count=1 -timeout 5m ./...) || exit 1; done'
