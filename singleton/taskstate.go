package singleton

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/hibiken/asynq"
)

// taskStateQueuesFor is how long the function TaskState returns keeps the
// list of queues it looks for tasks in.
const taskStateQueuesFor = 10 * time.Second

// TaskState returns a function for opsview.WithTaskState: for a holder's
// label (the asynq task ID, or for a Requeue copy its first task's ID), the
// task's state as insp reports it ("active", "pending", "scheduled",
// "retry", "archived", "completed", "aggregating"), that of a copy an
// earlier version made for it ("<ID>~a" or "<ID>~b") when the first task is
// gone (a copy this version makes has an ID of its own, which only the
// servers' Redis names: it is not found, and "" is returned), and,
// when asynqmonURL is not "", a link to the task's page in asynqmon
// (asynqmonURL + "/queues/<queue>/tasks/<id>"). It looks for the task in
// every queue insp lists (the list is kept for 10 s): up to
// three GetTaskInfo calls per queue for a label that is no asynq task (a
// cron tick), for which it returns "" and "". It returns an error matching
// ErrInvalid for a nil insp or an asynqmonURL that is neither an http or
// https URL nor an absolute path (such as "/asynqmon", on the page's host).
func TaskState(insp *asynq.Inspector, asynqmonURL string) (func(ctx context.Context, taskID string) (state, link string), error) {
	if insp == nil {
		return nil, fmt.Errorf("%w: TaskState: the Inspector is nil", ErrInvalid)
	}
	if asynqmonURL != "" {
		u, err := url.Parse(asynqmonURL)
		web := (u.Scheme == "http" || u.Scheme == "https") && u.Host != ""
		path := u.Scheme == "" && u.Host == "" && strings.HasPrefix(asynqmonURL, "/") && !strings.HasPrefix(asynqmonURL, "//")
		if err != nil || !(web || path) {
			return nil, fmt.Errorf("%w: TaskState(%q): want asynqmon's root as an http or https URL or an absolute path", ErrInvalid, asynqmonURL)
		}
	}
	s := &taskStates{insp: insp, base: strings.TrimSuffix(asynqmonURL, "/")}
	return s.state, nil
}

// taskStates finds tasks in asynq for TaskState.
type taskStates struct {
	insp *asynq.Inspector
	base string

	mu     sync.Mutex
	queues []string
	listed time.Time
}

func (s *taskStates) state(ctx context.Context, label string) (string, string) {
	if label == "" {
		return "", ""
	}
	queues := s.queueList()
	for _, id := range deliveriesOf(label) {
		for _, q := range queues {
			if ctx.Err() != nil {
				return "", ""
			}
			if info, err := s.insp.GetTaskInfo(q, id); err == nil {
				link := ""
				if s.base != "" {
					link = s.base + "/queues/" + url.PathEscape(q) + "/tasks/" + url.PathEscape(id)
				}
				return info.State.String(), link
			}
		}
	}
	return "", ""
}

// queueList returns asynq's queues, listed at most every taskStateQueuesFor.
func (s *taskStates) queueList() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.queues == nil || time.Since(s.listed) > taskStateQueuesFor {
		if qs, err := s.insp.Queues(); err == nil {
			s.queues, s.listed = qs, time.Now()
		}
	}
	return s.queues
}
