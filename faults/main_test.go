//go:build faults

package faults_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	switch os.Getenv("JOBGUARD_FAULT_CHILD") {
	case "holder":
		holderChild()
		return
	case "asynq-worker":
		asynqWorkerChild()
		return
	}
	goleak.VerifyTestMain(m)
}

// toxiproxyProxy is an in-process TCP proxy that injects network faults
// between one client and Redis.
type toxiproxyProxy struct {
	t *testing.T
	p *toxiproxy.Proxy
}

func newProxy(t *testing.T, upstream string) *toxiproxyProxy {
	srv := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop())
	p := toxiproxy.NewProxy(srv, "redis", "127.0.0.1:0", upstream)
	require.NoError(t, p.Start())
	t.Cleanup(p.Stop)
	return &toxiproxyProxy{t: t, p: p}
}

// Listen returns the address clients connect to.
func (x *toxiproxyProxy) Listen() string { return x.p.Listen }

func (x *toxiproxyProxy) add(json string) {
	_, err := x.p.Toxics.AddToxicJson(strings.NewReader(json))
	require.NoError(x.t, err)
}

// blackhole drops every byte both ways without closing connections: a
// network partition.
func (x *toxiproxyProxy) blackhole() {
	x.add(`{"name":"cut-up","type":"timeout","stream":"upstream","attributes":{"timeout":0}}`)
	x.add(`{"name":"cut-down","type":"timeout","stream":"downstream","attributes":{"timeout":0}}`)
}

// latency delays every reply by d.
func (x *toxiproxyProxy) latency(d time.Duration) {
	x.add(`{"name":"slow","type":"latency","stream":"downstream","attributes":{"latency":` +
		strings.TrimSuffix(d.Round(time.Millisecond).String(), "ms") + `}}`)
}

// clear removes every toxic.
func (x *toxiproxyProxy) clear() { x.p.Toxics.ResetToxics(context.Background()) }
