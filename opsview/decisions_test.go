package opsview_test

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/jobguard/jobguard/internal/testredis"
	"github.com/jobguard/jobguard/lockkit/lockkittest"
	"github.com/jobguard/jobguard/opsview"
)

type decisionsReply struct {
	Decisions []struct {
		ID, At string
		Fields map[string]string
	}
	Next string
	Read int
}

func getDecisions(t *testing.T, h http.Handler, query string) (int, decisionsReply) {
	t.Helper()
	var r decisionsReply
	return getJSON(t, h, "/api/decisions?"+query, &r).Code, r
}

// With WithDecisionLog the page shows the asynq middleware's decisions,
// newest first, paged, filtered by the page's key pattern, with control
// bytes escaped and a write go-redis sent twice shown once.
func TestDecisionLogIsShown(t *testing.T) {
	ctx := context.Background()
	c := testredis.Client(t)
	stream := testredis.Prefix(t, c) + "decisions"
	add := func(values ...any) {
		require.NoError(t, c.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: values}).Err())
	}
	for i := range 5 {
		add("call", fmt.Sprint("c", i), "task", fmt.Sprint("t-", i), "origin", fmt.Sprint("t-", i), "type", "report", "queue", "default",
			"key", fmt.Sprint("tenant:", i), "reason", "held", "by_task", "t-0", "by_owner", "worker-7")
	}
	add("call", "c5", "task", "t-5", "type", "report", "queue", "default", "key", "report:\x1b[2J\nforged", "reason", "covered", "by_token", "1795650000000000")
	add("call", "c5", "task", "t-5", "type", "report", "queue", "default", "key", "report:\x1b[2J\nforged", "reason", "covered", "by_token", "1795650000000000")

	h, err := opsview.New(lockkittest.New(t), opsview.WithDecisionLog(c, stream))
	require.NoError(t, err)
	code, r := getDecisions(t, h, "limit=3")
	require.Equal(t, http.StatusOK, code)
	require.Len(t, r.Decisions, 3)
	require.Equal(t, "t-5", r.Decisions[0].Fields["task"], "newest first, the repeated write once")
	require.Equal(t, `report:\x1b[2J\nforged`, r.Decisions[0].Fields["key"], "escaped")
	require.Equal(t, "covered", r.Decisions[0].Fields["reason"])
	require.NotEmpty(t, r.Decisions[0].At)
	require.Equal(t, "t-4", r.Decisions[1].Fields["task"])
	require.NotEmpty(t, r.Next)
	code, r = getDecisions(t, h, "limit=3&before="+url.QueryEscape(r.Next))
	require.Equal(t, http.StatusOK, code)
	require.Len(t, r.Decisions, 3)
	require.Equal(t, []string{"t-2", "t-1", "t-0"}, []string{r.Decisions[0].Fields["task"], r.Decisions[1].Fields["task"], r.Decisions[2].Fields["task"]})
	require.Empty(t, r.Next, "the oldest entry was read")

	code, r = getDecisions(t, h, "pattern=tenant:[13]")
	require.Equal(t, http.StatusOK, code)
	require.Len(t, r.Decisions, 2)
	require.Equal(t, "tenant:3", r.Decisions[0].Fields["key"])
	require.Equal(t, "worker-7", r.Decisions[0].Fields["by_owner"])

	for _, bad := range []string{"before=x", "before=1-x", "limit=0"} {
		code, _ := getDecisions(t, h, bad)
		require.Equal(t, http.StatusBadRequest, code, bad)
	}
	var none *redis.Client
	for _, rdb := range []redis.UniversalClient{nil, none} {
		_, err = opsview.New(lockkittest.New(t), opsview.WithDecisionLog(rdb, ""))
		require.ErrorIs(t, err, opsview.ErrInvalid)
	}
	plain, err := opsview.New(lockkittest.New(t))
	require.NoError(t, err)
	code, _ = getDecisions(t, plain, "")
	require.Equal(t, http.StatusNotFound, code, "no decision log without WithDecisionLog")
}

// A page of the decision log shows 50 decisions by default and reads a
// bounded number of entries (5 XREVRANGE calls of 200), whatever the log's
// length: a filter that matches old entries only is followed page by page.
func TestDecisionLogReadsAreBounded(t *testing.T) {
	ctx := context.Background()
	c := testredis.Client(t)
	stream := testredis.Prefix(t, c) + "decisions"
	require.NoError(t, c.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: []any{"task", "old", "key", "tenant:old", "reason", "held"}}).Err())
	_, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i := range 2500 {
			p.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: []any{"task", fmt.Sprint("t-", i), "key", "other", "reason", "held"}})
		}
		return nil
	})
	require.NoError(t, err)
	h, err := opsview.New(lockkittest.New(t), opsview.WithDecisionLog(c, stream))
	require.NoError(t, err)
	code, r := getDecisions(t, h, "")
	require.Equal(t, http.StatusOK, code)
	require.Len(t, r.Decisions, 50, "a page's default size")
	before, pages := "", 0
	for {
		code, r := getDecisions(t, h, "pattern=tenant:*&before="+url.QueryEscape(before))
		require.Equal(t, http.StatusOK, code)
		pages++
		require.LessOrEqual(t, r.Read, 1000, "5 reads of 200 entries")
		if len(r.Decisions) > 0 {
			require.Equal(t, "old", r.Decisions[0].Fields["task"])
			break
		}
		require.NotEmpty(t, r.Next)
		before = r.Next
	}
	require.Equal(t, 3, pages, "2,501 entries, 1,000 a page")
}
