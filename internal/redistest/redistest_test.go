package redistest_test

import (
	"context"
	"testing"

	"github.com/costgate/costgate/internal/redistest"
)

func TestPrivateServersAreIsolated(t *testing.T) {
	ctx := context.Background()
	a := redistest.New(t).Client(t)
	b := redistest.New(t).Client(t)
	if err := a.Set(ctx, "k", "a", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if n, err := b.Exists(ctx, "k").Result(); err != nil || n != 0 {
		t.Fatalf("second server sees the first's key: n=%d err=%v", n, err)
	}
}

func TestStopAndRestart(t *testing.T) {
	ctx := context.Background()
	s := redistest.New(t)
	c := s.Client(t)
	s.Stop(t)
	if err := c.Ping(ctx).Err(); err == nil {
		t.Fatal("ping succeeded on a stopped server")
	}
	s.Restart(t)
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("ping after restart: %v", err)
	}
}
