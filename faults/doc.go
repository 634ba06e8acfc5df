// Package faults holds jobguard's fault suite: Redis restarts, network
// latency and partitions (through an in-process toxiproxy), killed worker
// processes, asynq shutdowns and skewed cron replicas. Each scenario records
// every run and reports overlaps, lost work and recovery time. The tests are
// built with the "faults" tag: run them with `make test-faults`.
package faults
