package webtest

import (
	"context"
	"fmt"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/jobguard/jobguard/internal/lockcore"
	"github.com/jobguard/jobguard/internal/lockcore/coretest"
	"github.com/jobguard/jobguard/lockkit"
	"github.com/jobguard/jobguard/lockkit/lockkittest"
	"github.com/jobguard/jobguard/opsview"
)

// browser returns a chromedp context on a headless chromium.
func browser(t *testing.T) context.Context {
	path := os.Getenv("CHROMIUM")
	if path == "" {
		var err error
		if path, err = exec.LookPath("chromium"); err != nil {
			t.Fatal("chromium not found: install Debian's chromium (make test-browser does) or set CHROMIUM")
		}
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path),
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(t.TempDir()),
	)
	actx, cancel := chromedp.NewExecAllocator(context.Background(), opts...)
	t.Cleanup(cancel)
	ctx, cancel2 := chromedp.NewContext(actx)
	t.Cleanup(cancel2)
	ctx, cancel3 := context.WithTimeout(ctx, 60*time.Second)
	t.Cleanup(cancel3)
	return ctx
}

// sharedRedis returns a client of the Redis at REDIS_ADDR, closed when the
// test ends, and a key prefix of the test's own.
func sharedRedis(t *testing.T) (*redis.Client, string) {
	addr := os.Getenv("REDIS_ADDR")
	require.NotEmpty(t, addr, "REDIS_ADDR: run with make test-browser")
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { _ = rdb.Close() })
	return rdb, "webtest:" + time.Now().Format("150405.000000") + ":"
}

// An operator loads the page while a worker holds locks, sees the rows,
// filters them, releases one key in two clicks: the holder's work is
// cancelled and its row says "cancelling" while the run (which ignores its
// ctx) goes on holding the key; then frees it anyway in two more clicks,
// the second one warning with the run's fencing token, and sees its row go.
func TestOperatorReleasesAStuckKey(t *testing.T) {
	rdb, prefix := sharedRedis(t)
	ctx := context.Background()
	worker, err := lockkit.NewRedis(rdb, lockkit.WithPrefix(prefix), lockkit.WithOwner("worker-7"))
	require.NoError(t, err)
	defer worker.Close(ctx)
	stuck, err := coretest.Of(t, worker).TryAcquire(ctx, "tenant:42", &lockcore.AcquireOptions{Label: "task-abc", TTL: 1500 * time.Millisecond})
	require.NoError(t, err)
	work, cancel := stuck.Context(ctx)
	defer cancel()
	other, err := worker.TryAcquire(ctx, "report:daily", nil)
	require.NoError(t, err)
	defer other.Release(ctx)
	_, err = coretest.Of(t, worker).TryAcquire(ctx, "report:daily", &lockcore.AcquireOptions{Label: "task-9", Reserve: true, Park: &lockcore.Parking{ID: "task-9"}})
	require.ErrorIs(t, err, lockkit.ErrNotAcquired) // parked for the key

	view, err := lockkit.NewRedis(rdb, lockkit.WithPrefix(prefix))
	require.NoError(t, err)
	defer view.Close(ctx)
	// A shared Redis may hold many other keys: one page looks through
	// enough of them to find the test's.
	h, err := opsview.New(view, opsview.WithRelease(), opsview.WithRefresh(200*time.Millisecond), opsview.WithScanBudget(1000, 1000))
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	defer srv.Close()

	b := browser(t)
	row := `tr[data-key="tenant:42"]`
	require.NoError(t, chromedp.Do(b,
		chromedp.Navigate(srv.URL+"/"),
		chromedp.WaitVisible(row),
		chromedp.WaitVisible(`tr[data-key="report:daily"]`),
	))
	// The rows are redrawn every 200ms: a cell is read in one step in the
	// page, so that a redraw cannot take its node away mid-read.
	cell := func(sel string) (string, error) {
		return chromedp.Run(b, chromedp.Evaluate[string](`(() => { const e = document.querySelector(`+strconv.Quote(sel)+`); return e ? e.textContent : ""; })()`))
	}
	holders, err := cell(row + ` td:nth-child(2)`)
	require.NoError(t, err)
	note, err := chromedp.Run(b, chromedp.Text(`#note`))
	require.NoError(t, err)
	require.Contains(t, holders, "worker-7 · task-abc · ")
	parked, err := cell(`tr[data-key="report:daily"] td.parked .count`)
	require.NoError(t, err)
	require.Equal(t, "1", parked, "one job parked for report:daily")
	parkedIDs, err := cell(`tr[data-key="report:daily"] td.parked details`)
	require.NoError(t, err)
	require.Contains(t, parkedIDs, "task-9", "its id, on expand")
	require.Contains(t, note, "behind your own authentication")

	// The filter asks the server for matching keys only.
	_, err = chromedp.Run(b, chromedp.Evaluate[bool](`(() => {
		const f = document.getElementById("filter");
		f.value = "tenant:*";
		return f.dispatchEvent(new Event("input")); // as typing does
	})()`))
	require.NoError(t, err)
	require.NoError(t, chromedp.Do(b,
		chromedp.WaitNotPresent(`tr[data-key="report:daily"]`),
		chromedp.WaitVisible(row),
	))

	// Two clicks: Release, then Confirm release.
	start := time.Now()
	// The page redraws its rows every 200ms: each click finds its button
	// and clicks it in one step in the page, so a redraw between the two
	// cannot take the node away.
	click := func(sel string) chromedp.Action[chromedp.Void] {
		return func(ctx context.Context, tg *chromedp.Target) (chromedp.Void, error) {
			clicked, err := chromedp.Evaluate[bool](`(() => { const b = document.querySelector(`+strconv.Quote(sel)+`); if (!b) return false; b.click(); return true; })()`)(ctx, tg)
			if err == nil && !clicked {
				err = fmt.Errorf("no %s to click", sel)
			}
			return chromedp.Void{}, err
		}
	}
	require.NoError(t, chromedp.Do(b,
		chromedp.WaitVisible(row+` button.release`),
		click(row+` button.release`),
		chromedp.WaitVisible(row+` button.confirm`),
		click(row+` button.confirm`),
		chromedp.WaitVisible(row+` .cancelling`),
	))
	select {
	case <-work.Done(): // at once (the operators' channel), at the latest at its next renewal: TTL/3 = 500ms
	case <-time.After(5 * time.Second):
		t.Fatal("the released holder's work was not cancelled")
	}
	require.ErrorIs(t, context.Cause(work), lockkit.ErrCancelled)
	require.Less(t, time.Since(start), 3*time.Second)
	holders, err = cell(row + ` td:nth-child(2)`)
	require.NoError(t, err)
	require.Contains(t, holders, "cancelling: waiting for the run to return")
	require.NoError(t, stuck.Err(), "the run still holds the key")
	info, err := view.Inspect(ctx, "tenant:42")
	require.NoError(t, err)
	require.Len(t, info.Holders, 1)
	require.True(t, info.Holders[0].Cancelling)

	// Free anyway: the confirmation warns that the run is still going.
	require.NoError(t, chromedp.Do(b,
		chromedp.WaitVisible(row+` button.force`),
		click(row+` button.force`),
		chromedp.WaitVisible(row+` button.confirm-force`),
	))
	warning, err := cell(row + ` td:nth-child(5)`)
	require.NoError(t, err)
	require.Contains(t, warning, fmt.Sprintf("The run is still going: a new run may start beside it; its writes carry fencing token %d", stuck.Token()))
	require.NoError(t, chromedp.Do(b,
		click(row+` button.confirm-force`),
		chromedp.WaitNotPresent(row),
	))
	status, err := chromedp.Run(b, chromedp.Text(`#status`))
	require.NoError(t, err)
	require.True(t, strings.Contains(status, "key(s) held") || strings.Contains(status, "freed 1 holder(s)"), status)
	info, err = view.Inspect(ctx, "tenant:42")
	require.NoError(t, err)
	require.Empty(t, info.Holders)
}

// Read-only by default: no release button.
func TestReadOnlyPageHasNoReleaseButton(t *testing.T) {
	l := lockkittest.New(t, lockkit.WithOwner("worker-1"))
	_, err := l.TryAcquire(context.Background(), "k", nil)
	require.NoError(t, err)
	h, err := opsview.New(l)
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	defer srv.Close()
	b := browser(t)
	require.NoError(t, chromedp.Do(b,
		chromedp.Navigate(srv.URL+"/"),
		chromedp.WaitVisible(`tr[data-key="k"]`),
	))
	buttons, err := chromedp.Run(b, chromedp.Evaluate[int](`document.querySelectorAll("button.release, button.confirm").length`))
	require.NoError(t, err)
	note, err := chromedp.Run(b, chromedp.Text(`#note`))
	require.NoError(t, err)
	require.Zero(t, buttons)
	require.Contains(t, note, "Read-only view")
}

// With realistic data (25 keys of tenant reports, Kubernetes-style owners,
// a parked task's reservation) the page stays readable:
// at 1280×800 the Key column is at least 18 characters wide, a row is one
// or two lines, nothing scrolls sideways, and a long key is cut with the
// whole key as its tooltip; at 390 px wide the rows stack and still nothing
// scrolls sideways.
func TestPageHoldsRealisticData(t *testing.T) {
	ctx := context.Background()
	l := lockkittest.New(t, lockkit.WithOwner("report-worker-7c9d8f6b5-x2kqz:1:3f9a2c7d"))
	long := "asynq:report:build:tenant_id=\"org_2b7c9e4f1a3d5b6c8e0f2a4c6e8b0d2f\":region=\"eu-west-1\":period=\"2026-11\""
	for i := range 24 {
		_, err := coretest.Of(t, l).TryAcquire(ctx, fmt.Sprintf("asynq:report:build:tenant_id=\"org_%04d\"", i), &lockcore.AcquireOptions{Label: fmt.Sprintf("0c636fe2-2986-4526-941b-fe6074c0%04d", i)})
		require.NoError(t, err)
	}
	// The release of the long key reserves it for the job parked for it:
	// the reservation's owner is "parked:" and the job's id, newlines and all.
	first, err := coretest.Of(t, l).TryAcquire(ctx, long, &lockcore.AcquireOptions{Label: "b225dc7119beeb5c63e9fd535b4ee120", Park: &lockcore.Parking{OnParked: func(string, string) {}}})
	require.NoError(t, err)
	_, err = coretest.Of(t, l).TryAcquire(ctx, long, &lockcore.AcquireOptions{Label: "parked\nlabel", Reserve: true, Park: &lockcore.Parking{ID: "default\nid-1\nid-1"}})
	require.ErrorIs(t, err, lockkit.ErrNotAcquired)
	require.NoError(t, first.Release(ctx))
	h, err := opsview.New(l, opsview.WithRelease())
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	defer srv.Close()

	b := browser(t)
	row := `tr[data-key=` + strconv.Quote(long) + `]`
	require.NoError(t, chromedp.Do(b,
		chromedp.EmulateViewport(1280, 800),
		chromedp.Navigate(srv.URL+"/"),
		chromedp.WaitVisible(row),
	))
	type layout struct {
		ScrollWidth, ClientWidth, MinKeyWidth, MaxRowHeight, Rows int
		CharWidth                                                 float64
		Title, Text                                               string
	}
	measure := func() layout {
		got, err := chromedp.Run(b, chromedp.Evaluate[layout](`(() => {
			const keys = [...document.querySelectorAll("#locks td.key")];
			const rows = [...document.querySelectorAll("#locks tr")];
			const probe = document.createElement("span");
			probe.style.fontFamily = getComputedStyle(keys[0]).fontFamily;
			probe.style.fontSize = getComputedStyle(keys[0]).fontSize;
			probe.textContent = "0".repeat(100);
			document.body.appendChild(probe);
			const cw = probe.getBoundingClientRect().width / 100;
			probe.remove();
			const long = document.querySelector(`+strconv.Quote(row+" td.key")+`);
			return {
				ScrollWidth: document.documentElement.scrollWidth, ClientWidth: document.documentElement.clientWidth,
				MinKeyWidth: Math.round(Math.min(...keys.map(k => k.getBoundingClientRect().width))),
				MaxRowHeight: Math.round(Math.max(...rows.map(r => r.getBoundingClientRect().height))),
				Rows: rows.length, CharWidth: cw, Title: long.title, Text: document.body.innerText,
			};
		})()`))
		require.NoError(t, err)
		return got
	}
	wide := measure()
	require.Equal(t, 25, wide.Rows)
	require.LessOrEqual(t, wide.ScrollWidth, wide.ClientWidth, "nothing scrolls sideways at 1280 px")
	require.GreaterOrEqual(t, float64(wide.MinKeyWidth), 18*wide.CharWidth, "the Key column is at least 18 characters wide")
	require.LessOrEqual(t, wide.MaxRowHeight, 60, "a row is one or two lines")
	require.Equal(t, long, wide.Title, "the whole key is the cell's tooltip")
	require.Contains(t, wide.Text, "reserved for task id-1 · queue default", "a parked task's reservation names the task, not its raw entry")
	require.Contains(t, wide.Text, "held ")

	require.NoError(t, chromedp.Do(b, chromedp.EmulateViewport(390, 844)))
	narrow := measure()
	require.LessOrEqual(t, narrow.ScrollWidth, narrow.ClientWidth, "nothing scrolls sideways at 390 px")
	require.GreaterOrEqual(t, float64(narrow.MinKeyWidth), 30*narrow.CharWidth, "a key takes the row's width")
}

// With the decision log (WithDecisionLog) and realistic entries (UUID task
// IDs, asynq keys of JSON payloads, Kubernetes-style owners, a key with
// control bytes), and a holder's task state (WithTaskState) linked to
// asynqmon, the page shows the newest decisions first, 50 a page, with
// Older and Newer; the key filter narrows them; control bytes show escaped;
// and nothing scrolls sideways at 1280 or 390 px.
func TestDecisionLogRendersRealisticData(t *testing.T) {
	rdb, prefix := sharedRedis(t)
	ctx := context.Background()
	stream := prefix + "decisions"
	defer rdb.Del(ctx, stream)
	reasons := []string{"held", "covered", "superseded", "throttled", "completed", "preempted"}
	for i := range 60 {
		task := fmt.Sprintf("0c636fe2-2986-4526-941b-fe6074c0%04d", i)
		key := fmt.Sprintf("asynq:report:build:{\"tenant_id\":\"org_%04d\",\"region\":\"eu-west-1\",\"period\":\"2026-11\"}", i%7)
		if i == 59 {
			key = "asynq:report:\x1b[2J\nforged"
		}
		values := []any{"call", fmt.Sprint("call-", i), "task", task, "origin", task, "type", "report:build", "queue", "critical",
			"key", key, "reason", reasons[i%len(reasons)], "by_task", fmt.Sprintf("b225dc71-19be-eb5c-63e9-fd535b4e%04d", i),
			"by_owner", "report-worker-7c9d8f6b5-x2kqz:1:3f9a2c7d", "by_token", "1795650000000000"}
		require.NoError(t, rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: values}).Err())
	}
	l := lockkittest.New(t, lockkit.WithOwner("report-worker-7c9d8f6b5-x2kqz:1:3f9a2c7d"))
	_, err := coretest.Of(t, l).TryAcquire(ctx, "asynq:report:build:tenant_id=org_0001", &lockcore.AcquireOptions{Label: "0c636fe2-2986-4526-941b-fe6074c00001"})
	require.NoError(t, err)
	// The holder's task state in asynq and its asynqmon page, as
	// singleton.TaskState gives them.
	state := func(_ context.Context, id string) (string, string) {
		return "active", "/asynqmon/queues/critical/tasks/" + id
	}
	h, err := opsview.New(l, opsview.WithDecisionLog(rdb, stream), opsview.WithRefresh(200*time.Millisecond), opsview.WithTaskState(state))
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	defer srv.Close()

	b := browser(t)
	require.NoError(t, chromedp.Do(b,
		chromedp.EmulateViewport(1280, 800),
		chromedp.Navigate(srv.URL+"/"),
		chromedp.WaitVisible(`#decisions`),
		chromedp.WaitVisible(`#decision-rows tr[data-task="0c636fe2-2986-4526-941b-fe6074c00059"]`),
	))
	type view struct {
		Rows, ScrollWidth, ClientWidth int
		First, Last, Text              string
		Older, Newer                   bool
	}
	look := func() view {
		got, err := chromedp.Run(b, chromedp.Evaluate[view](`(() => {
			const rows = [...document.querySelectorAll("#decision-rows tr")];
			return {
				Rows: rows.length, First: rows[0].dataset.task || "", Last: rows[rows.length - 1].dataset.task || "",
				ScrollWidth: document.documentElement.scrollWidth, ClientWidth: document.documentElement.clientWidth,
				Text: document.getElementById("decisions").innerText,
				Older: !document.getElementById("older").disabled, Newer: !document.getElementById("newer").disabled,
			};
		})()`))
		require.NoError(t, err)
		return got
	}
	first := look()
	require.Equal(t, 50, first.Rows, "50 a page")
	require.Equal(t, "0c636fe2-2986-4526-941b-fe6074c00059", first.First, "newest first")
	require.Equal(t, "0c636fe2-2986-4526-941b-fe6074c00010", first.Last)
	require.True(t, first.Older)
	require.False(t, first.Newer)
	require.Contains(t, first.Text, `asynq:report:\x1b[2J\nforged`, "control bytes show escaped")
	require.Contains(t, first.Text, "preempted")
	require.Contains(t, first.Text, "x2kqz:1:3f9a2c7d", "an owner is cut in its middle: its pod suffix shows")
	require.LessOrEqual(t, first.ScrollWidth, first.ClientWidth, "nothing scrolls sideways at 1280 px")
	link, err := chromedp.Run(b, chromedp.Evaluate[[]string](`(() => { const a = document.querySelector("#locks a.state"); return a ? [a.textContent, a.getAttribute("href")] : []; })()`))
	require.NoError(t, err)
	require.Equal(t, []string{"active", "/asynqmon/queues/critical/tasks/0c636fe2-2986-4526-941b-fe6074c00001"}, link, "the holder's task state, linked to asynqmon")

	_, err = chromedp.Run(b, chromedp.Evaluate[bool](`(() => { document.getElementById("older").click(); return true; })()`))
	require.NoError(t, err)
	require.NoError(t, chromedp.Do(b, chromedp.WaitVisible(`#decision-rows tr[data-task="0c636fe2-2986-4526-941b-fe6074c00000"]`)))
	older := look()
	require.Equal(t, 10, older.Rows)
	require.True(t, older.Newer)
	require.False(t, older.Older, "the oldest page")

	// The key filter narrows the decisions too.
	_, err = chromedp.Run(b, chromedp.Evaluate[bool](`(() => {
		const f = document.getElementById("filter");
		f.value = "*org_0003*";
		return f.dispatchEvent(new Event("input"));
	})()`))
	require.NoError(t, err)
	require.NoError(t, chromedp.Do(b, chromedp.WaitVisible(`#decision-rows tr[data-task="0c636fe2-2986-4526-941b-fe6074c00052"]`)))
	narrowed := look()
	require.Equal(t, 8, narrowed.Rows, "i % 7 == 3 for 8 of the first 59")
	require.Equal(t, "0c636fe2-2986-4526-941b-fe6074c00052", narrowed.First)

	require.NoError(t, chromedp.Do(b, chromedp.EmulateViewport(390, 844)))
	small := look()
	require.LessOrEqual(t, small.ScrollWidth, small.ClientWidth, "nothing scrolls sideways at 390 px")
}

// What an operator on call sees, with realistic data: two pods of one
// deployment, a key stuck for a long time that a Unique record reserves
// for its next task, a Unique record of a key that is not held, a task
// parked behind a run, a key a run's end reserved for its parked task, a
// cron tick, and the decision log. The reservations are on the row of
// their key, with no button of their own; owners that differ only in the
// pod suffix stay distinguishable; parked tasks show as queue and task
// ID; the headings look like controls and at 390 px a menu sorts; the
// stuck key stands out. The page is kept as screenshots at 1280×800 and
// 390×844 in the test's artifact directory (go test -artifacts, as make
// test-browser runs it), whose paths the test logs.
func TestOnCallPage(t *testing.T) {
	rdb, prefix := sharedRedis(t)
	ctx := context.Background()
	stream := prefix + "decisions"
	defer rdb.Del(ctx, stream)
	podA, podB := "report-worker-7d9f8c6b5-x2k4p:1:3f9a2c7d", "report-worker-7d9f8c6b5-q8zr1:1:9b1c0e44"
	a, err := lockkit.NewRedis(rdb, lockkit.WithPrefix(prefix), lockkit.WithOwner(podA))
	require.NoError(t, err)
	defer a.Close(ctx)
	b, err := lockkit.NewRedis(rdb, lockkit.WithPrefix(prefix), lockkit.WithOwner(podB))
	require.NoError(t, err)
	defer b.Close(ctx)
	ca, cb := coretest.Of(t, a), coretest.Of(t, b)
	stuck := `asynq:report:build:tenant_id="acme"`
	queued := `asynq:report:build:tenant_id="globex"`
	busy := `asynq:invoice:send:tenant_id="initech"`
	handed := `asynq:invoice:send:tenant_id="umbrella"`
	acquire := func(c *lockcore.RedisLocker, key string, o *lockcore.AcquireOptions) *lockcore.Lease {
		t.Helper()
		l, err := c.TryAcquire(ctx, key, o)
		require.NoError(t, err)
		return l
	}
	acquire(ca, stuck, &lockcore.AcquireOptions{Label: "0c636fe2-2986-4526-941b-fe6074c00001"})
	acquire(ca, "unique:"+stuck, &lockcore.AcquireOptions{Label: "default/0c636fe2-2986-4526-941b-fe6074c00003", Reserve: true})
	// The stuck key has been held a while (see longMs below) when the
	// others are taken.
	time.Sleep(2500 * time.Millisecond)
	acquire(cb, "asynq:"+stuck[len("asynq:"):]+":region=\"eu\"", &lockcore.AcquireOptions{Label: "0c636fe2-2986-4526-941b-fe6074c00002"})
	acquire(cb, "unique:"+queued, &lockcore.AcquireOptions{Label: "critical/0c636fe2-2986-4526-941b-fe6074c00004", Reserve: true})
	acquire(cb, busy, &lockcore.AcquireOptions{Label: "0c636fe2-2986-4526-941b-fe6074c00005"})
	_, err = ca.TryAcquire(ctx, busy, &lockcore.AcquireOptions{Label: "0c636fe2-2986-4526-941b-fe6074c00006", Reserve: true,
		Park: &lockcore.Parking{ID: "default\n0c636fe2-2986-4526-941b-fe6074c00006\n0c636fe2-2986-4526-941b-fe6074c00006"}})
	require.ErrorIs(t, err, lockkit.ErrNotAcquired)
	first := acquire(ca, handed, &lockcore.AcquireOptions{Label: "0c636fe2-2986-4526-941b-fe6074c00007", Park: &lockcore.Parking{OnParked: func(string, string) {}}})
	_, err = cb.TryAcquire(ctx, handed, &lockcore.AcquireOptions{Label: "0c636fe2-2986-4526-941b-fe6074c00008", Reserve: true,
		Park: &lockcore.Parking{ID: "default\n0c636fe2-2986-4526-941b-fe6074c00008\n0c636fe2-2986-4526-941b-fe6074c00008", Hold: 30 * time.Second}})
	require.ErrorIs(t, err, lockkit.ErrNotAcquired)
	require.NoError(t, first.Release(ctx))
	acquire(cb, "cron:nightly-report", &lockcore.AcquireOptions{Label: "2026-11-29T03:00:00Z"})
	for i, reason := range []string{"held", "parked", "covered", "throttled"} {
		require.NoError(t, rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: []any{
			"call", fmt.Sprint("call-", i), "task", fmt.Sprintf("0c636fe2-2986-4526-941b-fe6074c0010%d", i), "type", "report:build",
			"queue", "default", "key", stuck, "reason", reason, "by_task", "0c636fe2-2986-4526-941b-fe6074c00001",
			"by_owner", podA, "by_token", "1795650000000000"}}).Err())
	}

	view, err := lockkit.NewRedis(rdb, lockkit.WithPrefix(prefix))
	require.NoError(t, err)
	defer view.Close(ctx)
	h, err := opsview.New(view, opsview.WithRelease(), opsview.WithDecisionLog(rdb, stream), opsview.WithScanBudget(1000, 1000),
		opsview.WithRefresh(time.Minute))
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	defer srv.Close()

	br := browser(t)
	row := func(key string) string { return `tr[data-key=` + strconv.Quote(key) + `]` }
	require.NoError(t, chromedp.Do(br,
		chromedp.EmulateViewport(1280, 800),
		chromedp.Navigate(srv.URL+"/"),
		chromedp.WaitVisible(row(stuck)),
		chromedp.WaitVisible(`#decision-rows tr[data-task="0c636fe2-2986-4526-941b-fe6074c00103"]`),
	))
	// Ten minutes is what marks a key as held long; the test waits two
	// seconds, not ten minutes (the page, refreshed every minute, keeps the
	// times it loaded), and sorts by how long the keys were held.
	_, err = chromedp.Run(br, chromedp.Evaluate[bool](`(() => { longMs = 2000; sort("held"); return true; })()`))
	require.NoError(t, err)
	type look struct {
		Keys                            []string
		Text, Stuck, Queued, Busy, Hand string
		Decisions                       string
		Buttons, QueuedButtons          int
		StuckLong, OthersLong           bool
		HeadingColor, BodyColor, Cursor string
		SortShown, Scroll               bool
		Badge                           string
	}
	get := func() look {
		got, err := chromedp.Run(br, chromedp.Evaluate[look](`(() => {
			const q = s => document.querySelector(s), rows = [...document.querySelectorAll("#locks tr")];
			const text = s => { const e = q(s); return e ? e.innerText : ""; };
			const th = q("th[data-sort=key]");
			const details = [...document.querySelectorAll("details")]; details.forEach(d => d.open = true);
			const badge = q("#locks tr.long .long-badge");
			return {
				Keys: rows.map(r => r.dataset.key), Text: document.body.innerText, Decisions: text("#decision-rows"),
				Stuck: text(`+strconv.Quote(row(stuck))+`), Queued: text(`+strconv.Quote(row(queued))+`),
				Busy: text(`+strconv.Quote(row(busy))+`), Hand: text(`+strconv.Quote(row(handed))+`),
				Buttons: document.querySelectorAll("#locks button").length,
				QueuedButtons: document.querySelectorAll(`+strconv.Quote(row(queued)+" button")+`).length,
				StuckLong: q(`+strconv.Quote(row(stuck))+`).classList.contains("long"),
				OthersLong: rows.filter(r => r.classList.contains("long")).length > 1,
				HeadingColor: getComputedStyle(th).color, BodyColor: getComputedStyle(document.body).color,
				Cursor: getComputedStyle(th).cursor, SortShown: q("#sort").offsetParent !== null,
				Scroll: document.documentElement.scrollWidth > document.documentElement.clientWidth,
				Badge: badge ? getComputedStyle(badge).backgroundColor : "",
			};
		})()`))
		require.NoError(t, err)
		return got
	}
	wide := get()
	for _, k := range wide.Keys {
		require.False(t, strings.HasPrefix(k, "unique:"), "a Unique record is no row of its own: %q", k)
	}
	require.Equal(t, stuck, wide.Keys[0], "sorted by how long held, the stuck key comes first, not its reservation")
	require.True(t, wide.StuckLong, "the stuck key stands out")
	require.False(t, wide.OthersLong, "and it alone")
	require.Equal(t, "rgb(187, 0, 0)", wide.Badge, "with a red badge, not only grey text")
	require.Contains(t, wide.Stuck, "unique: reserved for task 0c636fe2-2986-4526-941b-fe6074c00003 · queue default")
	require.Contains(t, wide.Queued, "not held")
	require.Contains(t, wide.Queued, "unique: reserved for task 0c636fe2-2986-4526-941b-fe6074c00004 · queue critical")
	require.Zero(t, wide.QueuedButtons, "a Unique record has no button of its own")
	require.Contains(t, wide.Busy, "task 0c636fe2-2986-4526-941b-fe6074c00006 · queue default", "a parked task by queue and ID")
	require.Contains(t, wide.Hand, "reserved for task 0c636fe2-2986-4526-941b-fe6074c00008 · queue default")
	require.NotContains(t, wide.Text, `\n0c636fe2`, "no raw parked entry")
	require.Contains(t, wide.Text, "x2k4p", "pod A's suffix")
	require.Contains(t, wide.Decisions, "x2k4p", "pod A's suffix, in the decision log too")
	require.Contains(t, wide.Text, "q8zr1", "pod B's suffix")
	require.Contains(t, wide.Text, "2026-11-29T03:00:00Z", "the cron holder's tick")
	require.NotEqual(t, wide.BodyColor, wide.HeadingColor, "a sortable heading is coloured as a control")
	require.Equal(t, "pointer", wide.Cursor)
	require.False(t, wide.Scroll, "nothing scrolls sideways at 1280 px")
	dir := t.ArtifactDir()
	shot := func(name string) {
		png, err := chromedp.Run(br, chromedp.FullScreenshot(100)) // the whole page, as a PNG
		require.NoError(t, err)
		path := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(path, png, 0o644))
		t.Logf("screenshot: %s", path)
	}
	shot("opsview-1280x800.png")

	require.NoError(t, chromedp.Do(br, chromedp.EmulateViewport(390, 844)))
	// Sort by key, then back to held longest with the menu.
	_, err = chromedp.Run(br, chromedp.Evaluate[bool](`(() => { sort("key"); return true; })()`))
	require.NoError(t, err)
	narrow := get()
	require.True(t, narrow.SortShown, "at 390 px the sort menu is shown")
	require.NotEqual(t, stuck, narrow.Keys[0])
	_, err = chromedp.Run(br, chromedp.Evaluate[bool](`(() => {
		const s = document.getElementById("sort");
		s.value = "held";
		return s.dispatchEvent(new Event("change")); // as choosing in the menu does
	})()`))
	require.NoError(t, err)
	narrow = get()
	require.Equal(t, stuck, narrow.Keys[0], "the menu sorts at 390 px")
	require.False(t, narrow.Scroll, "nothing scrolls sideways at 390 px")
	shot("opsview-390x844.png")
	require.False(t, wide.SortShown, "at 1280 px the headings sort")
}
