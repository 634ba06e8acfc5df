// Package asynqkey names the Redis keys of the asynq side: asynq's own keys
// that the asynq adapter (singleton) and the tests read or write (v0.26's
// layout, asynq's internal/base), the keys singleton keeps beside them
// and in its Locker, and the task headers singleton writes on the tasks it
// enqueues (which asynq stores in each task's message). Every other package
// builds these names here; they must stay byte for byte what running
// deployments use (their Redis holds keys and tasks carrying them).
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
// origin (singleton's copy ID), and the copy it replaced: "<previous>
// <latest>" (an earlier version wrote the latest alone).
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

// The task headers singleton writes. Tasks in running deployments carry
// them: the values never change.
const (
	// KeyHeader is the header in which a singleton.Client whose key is
	// finer than the task type (a key option other than KeyByType, or
	// PerQueue) records the task's key: the first 16 hex digits of the
	// key's SHA-256 and the key options, such as
	// `3fa2b1c4d5e6f708 KeyByFields("tenant_id")`. The key itself is not
	// stored, since it may hold tenant data that asynqmon would show. A
	// Middleware that derives another key for the task fails it with
	// singleton.ErrKeyMismatch; a task without the header (enqueued by a
	// plain asynq.Client) is not checked.
	KeyHeader = "jobguard-key"

	// LabelHeader is the header that a copy enqueued by Requeue carries:
	// its label, the ID of the first task of the Requeue chain, which each
	// copy keeps and which labels the lease of each of its runs.
	// KeyByTaskID keys a copy by it, so a copy keeps its first task's key.
	// The value keeps the older word "origin" (the chain's origin, as
	// decisionlog's origin field still says): tasks in running
	// deployments carry it.
	LabelHeader = "jobguard-origin-id"

	// OrderHeader is the header in which a singleton.Client records the
	// task's place in its key's order (middleware.Job.Order), taken from
	// Redis when the task is enqueued (Order is the key of the counter):
	// greater than every order given to an earlier enqueue of the key, and
	// at least the Redis server's time in microseconds. A Client with
	// Debounce records the task's generation instead, one with Unique its
	// reservation's fencing token, and one with ParkAtEnqueue none. A task
	// without it (or with a value that is not a positive integer) is
	// placed by its arrival at Redis.
	OrderHeader = "jobguard-order"

	// EnqueuedAtHeader is the header in which a singleton.Client records
	// when a task was enqueued: Unix microseconds on the Redis server's
	// clock, never earlier than the enqueue. A task without it (or with a
	// value that is not a positive integer) counts from its delivery.
	EnqueuedAtHeader = "jobguard-enqueued-at"

	// DebounceGenHeader is the header in which a singleton.Client with
	// Debounce records the task's request generation (debounce.Request.Gen).
	// The middleware runs such a task only if it is the newest request of
	// its key, or if the newest request's task does not exist.
	DebounceGenHeader = "jobguard-debounce-gen"
)
