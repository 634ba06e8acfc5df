// Package singleton is the asynq adapter of jobguard: an asynq.MiddlewareFunc
// that runs each task under a lockkit lease on a key derived from the task, so
// that tasks sharing a key never run at the same time (or no more than N at a
// time) across every asynq.Server sharing the lock store.
//
//	g, err := singleton.New(rdb, // the Redis the asynq servers and clients use
//		singleton.KeyByFields("tenant_id"),                    // one run per tenant at a time
//		singleton.WithPolicy(middleware.Requeue(time.Second)), // duplicates run again later
//	)
//	if err != nil { ... }
//	defer g.Close(ctx) // after srv.Shutdown
//	cfg := asynq.Config{Concurrency: 10}
//	g.Configure(&cfg) // a requeued duplicate is no failure, and comes back after the policy's delay
//	srv := asynq.NewServerFromRedisClient(rdb, cfg)
//	mux := asynq.NewServeMux()
//	mux.Use(g.Middleware) // or g.Middleware(handler) around a single handler
//	client, err := g.Client(asynq.NewClientFromRedisClient(rdb)) // keys tasks as the middleware does
//
// New and Middleware (with a Locker of the program's own, shared by
// several middlewares) take key options and the guard's settings
// (ServerOption: middleware's options, reachable here as WithPolicy,
// Requeue, ...), NewClient key options and the Client's (ClientOption), and
// Guard.Client the Client's only, so a misplaced option does not compile
// (Guard.Client refuses a key option with ErrInvalid: the Guard has its
// keys).
//
// The key is the task type unless a key option says otherwise (KeyByTaskID,
// KeyByPayload, KeyByFields, KeyFunc; PerQueue scopes any of them to the
// queue). What happens to a task whose key is held (a duplicate) is the
// policy given with WithPolicy, Skip by default:
//
//   - Skip: the duplicate completes without running the handler.
//   - Requeue: the duplicate is parked for its key and runs as soon as the
//     run holding the key ends (that run's worker moves it to pending); by
//     itself it comes back only as a backstop: the next in line the
//     policy's delay after the holder's lease would run out unrenewed, the
//     others after 30 seconds (under WithHoldAtLeast a run shorter than
//     the hold resumes the next in line at the hold's end). While it has
//     retries left it is returned to asynq as a retry that the IsFailure
//     of ServerConfig reports as no failure (Retried is not incremented and
//     no failure is counted). With no retries left (MaxRetry(0), or a budget used
//     up by real failures) a copy is enqueued with the same queue, payload,
//     headers, Timeout, Deadline and Retention and the remaining retry budget,
//     and the original is revoked (asynq.RevokeTask), so it is never archived
//     for being a duplicate.
//   - Wait (Wait, WaitInOrder): the duplicate waits up to a bound, optionally in
//     arrival order, then falls back to the wrapped policy.
//   - Fail: the duplicate returns a *middleware.DuplicateError (errors.Is
//     middleware.ErrDuplicate) and asynq's normal retry applies.
//
// The lease is renewed while the handler runs; if it is lost, the handler's ctx
// is cancelled with a cause matching lockkit.ErrLost. It stays held until the
// handler returns, even after asynq cancels the ctx at shutdown and puts the
// task back. The re-delivered task waits for the old run, whatever the policy,
// and runs only if that run did not succeed: a task is never skipped as a
// duplicate of itself, and never because of a Redis error.
//
// A task whose key cannot be derived (payload not JSON, field missing, empty
// key) fails with an error matching ErrKey and asynq.SkipRetry: asynq archives
// it with a message naming the task type and the reason. A task whose Client
// derived another key (NewClient) fails with ErrKeyMismatch and
// asynq.SkipRetry rather than being taken for a duplicate. Every task that
// completes without running is logged at Info (at most once per key per
// second) and says why in its asynq result (JSON: outcome, key, reason and,
// where known, by_task, by_owner, by_token), which the Inspector and asynqmon
// show while asynq keeps the task (asynq.Retention).
package singleton
