// Package asynqkey names the Redis keys of the asynq side: asynq's own keys
// that the asynq adapter (singleton) and the tests read or write (v0.26's
// layout, asynq's internal/base), and the keys singleton keeps beside them
// and in its Locker. Every other package builds these names here; they
// must stay byte for byte what running deployments use.
//
// The Lua scripts of singleton that take Queue(queue) as an argument build
// names of asynq's from it as asynq does: a task's hash,
// Queue(queue) .. "t:" .. id (Task), its StateField, and the sorted set of
// a state, Queue(queue) .. state ("scheduled", or "retry": Retry).
package asynqkey

// Queue is the prefix of asynq's keys of queue, "asynq:{<queue>}:": every
// one of them is in the queue's Cluster slot (base.QueueKeyPrefix).
func Queue(queue string) string { return "asynq:{" + queue + "}:" }

// Task is the key of asynq's hash of task id in queue (base.TaskKey).
func Task(queue, id string) string { return Queue(queue) + "t:" + id }

// Pending is queue's list of tasks waiting to be processed.
func Pending(queue string) string { return Queue(queue) + "pending" }

// Active is queue's list of tasks being processed.
func Active(queue string) string { return Queue(queue) + "active" }

// Lease is queue's sorted set of the active tasks' worker leases (their
// expiry, in seconds).
func Lease(queue string) string { return Queue(queue) + "lease" }

// Retry is queue's sorted set of tasks waiting to retry (their time, in
// seconds).
func Retry(queue string) string { return Queue(queue) + "retry" }

// StateField is the field of a task's hash (Task) that holds its state
// ("pending", "active", "scheduled", "retry", "archived", "completed",
// "aggregating").
const StateField = "state"

// Copy is the key, beside asynq's keys of queue (in its Cluster slot),
// that names the copy Requeue enqueued of the work first enqueued as
// origin (singleton's copy ID).
func Copy(queue, origin string) string { return Queue(queue) + "jobguard-copy:" + origin }

// TypeKey is the key of a task of type taskType by KeyByType,
// "asynq:<type>", and the start of every key singleton's other built-in key
// options derive ("asynq:<type>:..."), so that they do not collide with
// keys of other adapters sharing a Locker.
func TypeKey(taskType string) string { return "asynq:" + taskType }

// Reservation is the lock key of Unique's reservation of key, the task's
// key: "unique:<key>".
func Reservation(key string) string { return "unique:" + key }

// Order is the key of the counter from which a Client takes the order of
// each enqueue of key (OrderHeader).
func Order(key string) string { return "jobguard:order:" + key }
