# jobguard. `make test` needs nothing but Go: it starts its own redis-server on a
# free port when REDIS_ADDR is unset (installing redis-server with apt-get if
# the binary is missing) and stops it afterwards; fencesql's tests start a
# PostgreSQL server of their own (installing Debian's postgresql if missing).
GO ?= go
PKGS := ./...
# Integration modules: each has its own go.mod, so that its dependency
# (gocron, Prometheus, OpenTelemetry, a SQL driver in fencesql's tests) is in
# no core user's build.
MODULES := gocronguard jobguardprom jobguardotel fencesql

# NEED_REDIS_SERVER, a recipe line, installs redis-server with apt-get when
# the binary is missing.
NEED_REDIS_SERVER = @command -v redis-server >/dev/null 2>&1 || { echo "installing redis-server"; export DEBIAN_FRONTEND=noninteractive; apt-get install -y -q redis-server >/dev/null || { apt-get update -q >/dev/null && apt-get install -y -q redis-server >/dev/null; }; }

# NEED_POSTGRESQL, a recipe line, installs Debian's postgresql (initdb and
# postgres in /usr/lib/postgresql/<version>/bin) with apt-get when no
# PostgreSQL server binary is found: fencesql's tests start a server of their
# own with it, never the one the package may start on port 5432.
NEED_POSTGRESQL = @ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1 || command -v postgres >/dev/null 2>&1 || { echo "installing postgresql"; export DEBIAN_FRONTEND=noninteractive; apt-get install -y -q postgresql >/dev/null || { apt-get update -q >/dev/null && apt-get install -y -q postgresql >/dev/null; }; }

.PHONY: test test-compat test-faults test-failover test-browser chaos chaos-ci bench lint run-demo run-worker run-scheduler

## test: every test with the race detector, against a real redis-server: the
## core module, and beside it the integration modules ($(MODULES), whose
## tests mostly wait for cron ticks; fencesql's against a PostgreSQL server
## they start); each one's output is printed whole when both have ended
## (tools/together.sh).
test:
	$(NEED_POSTGRESQL)
	@tools/with-redis.sh tools/together.sh test \
		'core module' '$(GO) test -race -count=1 -timeout 10m $(PKGS)' \
		'integration modules' 'for m in $(MODULES); do (cd $$m && $(GO) test -race -count=1 -timeout 5m ./...) || exit 1; done'


## test-compat: the go.mod files require the lowest versions of the
## dependencies the tests pass with (go-redis v9.17.3, Go 1.24, as asynq
## v0.26.0), which `make test` runs at; this runs vet, lockkit's tests,
## singleton's that call go-redis, and the integration tests at the newest
## versions, in a temporary copy.
test-compat:
	$(NEED_POSTGRESQL)
	@JOBGUARD_NO_CLUSTER=1 tools/with-redis.sh tools/compat.sh

## bench: the comparison harness (bench/, a separate module) and the Go benchmarks.
bench:
	@tools/with-redis.sh sh -c 'cd bench && $(GO) run . -out ../BENCHMARKS.md'
	@tools/with-redis.sh $(GO) test -run '^$$' -bench . -benchtime 2000x ./internal/lockcore/

STATICCHECK ?= $(GO) run honnef.co/go/tools/cmd/staticcheck@v0.8.2

## lint: gofmt, go vet and staticcheck.
lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)
	$(STATICCHECK) ./...
	cd faults && $(GO) vet -tags faults ./... && $(STATICCHECK) -tags faults ./...
	cd bench && $(GO) vet ./... && $(STATICCHECK) ./...
	cd chaos && $(GO) vet ./... && $(STATICCHECK) ./...
	cd failover && $(GO) vet ./... && $(STATICCHECK) ./...
	for m in $(MODULES); do (cd $$m && $(GO) vet ./... && $(STATICCHECK) ./...) || exit 1; done
	cd webtest && $(GO) vet ./... && $(STATICCHECK) ./...

## run-demo: the lockkit demo (embedded Redis unless REDIS_ADDR is set).
run-demo:
	$(GO) run ./examples/lockdemo

## test-faults: the fault suite (faults/, a separate module: Redis restart,
## partitions, killed processes, lost and repeated replies).
test-faults:
	@tools/with-redis.sh sh -c 'cd faults && $(GO) test -race -count=1 -timeout 10m -tags faults ./...'

## test-failover: the failover suite (failover/, a separate module) with the
## race detector: lockkit leases on a Redis Sentinel deployment and on a
## Redis Cluster with replicas, each of the run's own; masters are SIGKILLed
## right after an acquire, a release or a renewal (and, forced, with their
## replicas cut off first), and each scenario prints one line of figures
## (overlaps, lost leases, stranded keys, failover times). FAILOVERS=n
## failovers per scenario (1: about 40s; each one more adds about 30s).
FAILOVERS ?= 1
test-failover:
	$(NEED_REDIS_SERVER)
	cd failover && JOBGUARD_FAILOVERS=$(FAILOVERS) $(GO) test -race -count=1 -timeout 6h -v ./...

## chaos: the seeded chaos run (chaos/, a separate module): worker processes
## under singleton.Middleware against a redis-server of its own, a workload and
## faults drawn from a seed, a history checked rule by rule. SEED=n replays
## one seed (0: a random one), SEEDS=n runs n seeds from it, DURATION=30m runs
## seeds for that long, LENGTH is each seed's enqueue-and-fault phase, ARGS
## more flags (-broken none|skip|fence|extrakeys: a negative control that must fail); CLUSTER=1
## runs against a 3-master Redis Cluster of the run's own, FAILOVER=1 against a
## master, two replicas and three sentinels of its own, the master killed and
## a replica promoted by the Redis faults (-broken acks: Lockers that wait for
## no replica, a negative control). Histories of failing seeds stay in
## chaos/chaos-out/.
SEED ?= 0
SEEDS ?= 1
LENGTH ?= 20s
DURATION ?= 0
CLUSTER ?=
FAILOVER ?=
chaos:
	$(NEED_REDIS_SERVER)
	cd chaos && $(GO) run . -seed $(SEED) -seeds $(SEEDS) -length $(LENGTH) -duration $(DURATION) $(if $(CLUSTER),-cluster) $(if $(FAILOVER),-failover) $(ARGS)

## chaos-ci: the bounded chaos run of .ci/run: one fixed seed on standalone
## Redis and one on the Cluster, and the checkers' own tests (the negative
## controls must report their rules), side by side (each with Redis servers,
## ports and directories of its own; mostly waiting, so together they take
## about as long as the longest); each one's output is printed whole, under
## its exit status, and any failure fails the target. With them, the failover
## suite's Sentinel tests at one failover per scenario (without and with
## lockkit.WithReplicaAcks; make test-failover runs the Cluster's too, and
## more failovers).
chaos-ci:
	@GO='$(GO)' tools/chaos-ci.sh \
		'standalone seed 1' '$(MAKE) --no-print-directory chaos SEED=1 SEEDS=1 LENGTH=15s' \
		'Cluster seed 4' '$(MAKE) --no-print-directory chaos SEED=4 SEEDS=1 LENGTH=10s CLUSTER=1' \
		'checker tests' 'cd chaos && $(GO) test -count=1 ./...' \
		'failover on Sentinel' 'cd failover && JOBGUARD_FAILOVERS=1 $(GO) test -count=1 -run "^TestSentinel" ./...'

## test-browser: opsview's page in headless chromium (webtest/, a separate
## module with chromedp; without -race: opsview's own tests run with it in
## make test); installs Debian's chromium when it is missing. The
## screenshots the tests take (go test -artifacts) are kept in
## webtest/_artifacts/, and their paths printed.
test-browser:
	@command -v chromium >/dev/null 2>&1 || { echo "installing chromium"; export DEBIAN_FRONTEND=noninteractive; apt-get install -y -q chromium >/dev/null || { apt-get update -q >/dev/null && apt-get install -y -q chromium >/dev/null; }; }
	@rm -rf webtest/_artifacts
	@tools/with-redis.sh sh -c 'cd webtest && $(GO) test -count=1 -timeout 5m -artifacts ./...'
	@find webtest/_artifacts -name '*.png' | sort | sed 's/^/screenshot: /'

## run-worker: the asynq demo (embedded Redis unless REDIS_ADDR is set).
run-worker:
	$(GO) run ./examples/worker

## run-scheduler: three cron replicas enqueueing one asynq task per tick (embedded Redis unless REDIS_ADDR is set).
run-scheduler:
	$(GO) run ./examples/scheduler
