package weighted

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// clusterDown is the reply of a Redis Cluster that lost a slot's primary
// and has no replica to promote.
type clusterDown struct{}

func (clusterDown) Error() string { return "CLUSTERDOWN The cluster is down" }
func (clusterDown) RedisError()   {}

// downScripter answers every call CLUSTERDOWN and counts them.
type downScripter struct{ calls atomic.Int64 }

func (d *downScripter) Process(_ context.Context, cmd redis.Cmder) error {
	d.calls.Add(1)
	cmd.SetErr(clusterDown{})
	return clusterDown{}
}

// TestEvalAtkClusterStaysDown: a CLUSTERDOWN reply is sent again, as the
// cluster may elect a primary; but a cluster that stays down, under a
// caller's context without a deadline (a library user's Reset), must not
// hold the call forever: it fails after maxEvalAttempts calls.
func TestEvalAtkClusterStaysDown(t *testing.T) {
	d := &downScripter{}
	r := NewRedis(d, RedisConfig{Sharded: true})
	done := make(chan error, 1)
	go func() {
		done <- r.Reset(context.Background(), []Item{{Limit: Limit{Name: "tb", Rate: 10, Period: time.Minute}, Key: "{acme}"}})
	}()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("Reset on a cluster that stays down succeeded")
		}
		if n := d.calls.Load(); n != maxEvalAttempts {
			t.Fatalf("%d calls, want %d", n, maxEvalAttempts)
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("Reset on a cluster that stays down still waits after 20 s (%d calls)", d.calls.Load())
	}
}
