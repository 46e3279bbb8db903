package gate

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/costgate/costgate/internal/redistest"
)

// TestObjectOwners: an object's tenant is what was recorded for it, on
// each store; an id never recorded, or empty or too long, is no tenant's;
// the in-memory table keeps at most memObjects records, the newest.
func TestObjectOwners(t *testing.T) {
	srv := redistest.New(t)
	for _, c := range []struct{ name, store string }{
		{"memory", ""},
		{"redis", fmt.Sprintf("store: {redis: %q}", srv.URL)},
	} {
		t.Run(c.name, func(t *testing.T) {
			g := openAcme(t, c.store)
			ctx := context.Background()
			if err := g.OwnObject(ctx, "acme", "resp_1"); err != nil {
				t.Fatal(err)
			}
			if tenant, ok, err := g.ObjectOwner(ctx, "resp_1"); err != nil || !ok || tenant != "acme" {
				t.Errorf("resp_1: %q %v %v; want acme", tenant, ok, err)
			}
			if _, ok, err := g.ObjectOwner(ctx, "resp_2"); err != nil || ok {
				t.Errorf("resp_2, never recorded: found %v, %v", ok, err)
			}
			long := strings.Repeat("x", maxObjectID+1)
			for _, id := range []string{"", long} {
				if err := g.OwnObject(ctx, "acme", id); !errors.Is(err, ErrObjectID) {
					t.Errorf("recording %d bytes of id: %v; want ErrObjectID", len(id), err)
				}
				if _, ok, err := g.ObjectOwner(ctx, id); ok || err != nil {
					t.Errorf("asking for %d bytes of id: found %v, %v", len(id), ok, err)
				}
			}
		})
	}
	t.Run("memory bound", func(t *testing.T) {
		g := openAcme(t, "")
		ctx := context.Background()
		for i := range memObjects + memObjects/2 {
			if err := g.OwnObject(ctx, "acme", fmt.Sprintf("resp_%d", i)); err != nil {
				t.Fatal(err)
			}
		}
		if n := len(g.objects.owner); n > memObjects {
			t.Errorf("%d records kept; bound %d", n, memObjects)
		}
		if _, ok, _ := g.ObjectOwner(ctx, fmt.Sprintf("resp_%d", memObjects+memObjects/2-1)); !ok {
			t.Error("the newest record is gone")
		}
	})
}

// TestObjectOwnersRedisDown: with the limiter's Redis gone, a record can
// be neither made nor read: each call says so with an error within the
// store's bound, never a hang and never an answer of no tenant.
func TestObjectOwnersRedisDown(t *testing.T) {
	srv := redistest.New(t)
	if !srv.Private() {
		t.Fatal("the test stops its Redis: it needs redis-server installed")
	}
	g := openAcme(t, fmt.Sprintf("store: {redis: %q, timeout: 50ms, queue_timeout: 50ms}", srv.URL))
	ctx := context.Background()
	if err := g.OwnObject(ctx, "acme", "resp_1"); err != nil {
		t.Fatal(err)
	}
	srv.Stop(t)
	for range 3 {
		start := time.Now()
		if err := g.OwnObject(ctx, "acme", "resp_2"); err == nil {
			t.Error("a record made with Redis down")
		}
		if _, found, err := g.ObjectOwner(ctx, "resp_1"); err == nil || found {
			t.Errorf("resp_1 read with Redis down: found %v, %v; want an error", found, err)
		}
		if took := time.Since(start); took > 2*time.Second {
			t.Errorf("two calls took %v with Redis down", took)
		}
	}
}
