package weighted

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/costgate/costgate/internal/redistest"
)

// TestIsStoreFailure takes every kind of error the package returns, each
// produced by a real call where one can produce it, and requires that
// IsStoreFailure counts exactly the store's own failures.
func TestIsStoreFailure(t *testing.T) {
	srv := redistest.New(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1})
	defer c.Close()
	ctx := context.Background()
	r := NewRedis(c, patient(RedisConfig{Prefix: "e:"}))
	m := NewMemory(MemoryConfig{})
	l := Limit{Name: "l", Rate: 10, Period: time.Second}
	one := []Item{{Limit: l, Key: "{k}", Cost: 1}}
	// A key of the wrong type: Redis answers the script with an error.
	wrongType := []Item{{Limit: Limit{Name: "log", Algorithm: SlidingLog, Rate: 10, Period: time.Second}, Key: "{k}", Cost: 1}}
	if err := c.Set(ctx, r.key(&wrongType[0]), "x", 0).Err(); err != nil {
		t.Fatal(err)
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	expired, cancel2 := context.WithDeadline(ctx, time.Unix(1, 0))
	defer cancel2()

	type errCase struct {
		name  string
		err   func(s Store) error
		store bool
	}
	debit := func(ctx context.Context, id string, items []Item) func(Store) error {
		return func(s Store) error { _, err := s.Debit(ctx, id, items); return err }
	}
	cases := []errCase{
		{"cost above capacity", debit(ctx, "a", []Item{{Limit: l, Key: "{k}", Cost: 11}}), false},
		{"duplicate item", debit(ctx, "a", []Item{one[0], one[0]}), false},
		{"negative cost", debit(ctx, "a", []Item{{Limit: l, Key: "{k}", Cost: -1}}), false},
		{"empty id", debit(ctx, "", one), false},
		{"invalid limit", debit(ctx, "a", []Item{{Limit: Limit{Name: "bad"}, Key: "{k}"}}), false},
		{"settle without actual costs", func(s Store) error { return s.Settle(ctx, "a", one, nil) }, false},
		{"negative actual cost", func(s Store) error { return s.Settle(ctx, "a", one, []int64{-1}) }, false},
		{"negative counted", func(s Store) error { return s.(Restorer).Restore(ctx, one, []int64{-1}) }, false},
	}
	for _, tc := range cases {
		for _, s := range []namedStore{{"memory", m}, {"redis", r}} {
			t.Run(tc.name+"/"+s.name, func(t *testing.T) {
				err := tc.err(s.Store)
				if err == nil {
					t.Fatal("no error")
				}
				if got := IsStoreFailure(err); got != tc.store {
					t.Fatalf("IsStoreFailure(%v) = %v, want %v", err, got, tc.store)
				}
			})
		}
	}
	if err := fmt.Errorf("%w", errNegative); !errors.Is(err, ErrInvalidCost) {
		t.Fatalf("a negative actual cost does not match ErrInvalidCost: %v", err)
	}
	if _, err := r.Debit(ctx, "a", []Item{{Limit: l, Key: "{k}", Cost: -1}}); !errors.Is(err, ErrInvalidCost) {
		t.Fatalf("a negative cost does not match ErrInvalidCost: %v", err)
	}

	redisCases := []errCase{
		// A key the request cannot read is its own failure: Redis answered.
		{"wrong type", debit(ctx, "a", wrongType), false},
		{"value too short", func(s Store) error {
			short := []Item{{Limit: l, Key: "{short}", Cost: 1}}
			if err := c.Set(ctx, r.key(&short[0]), "x", 0).Err(); err != nil {
				t.Fatal(err)
			}
			_, err := s.Debit(ctx, "a", short)
			return err
		}, false},
		// A server that refuses writes is the store's failure.
		{"out of memory", func(s Store) error {
			if err := c.ConfigSet(ctx, "maxmemory", "1").Err(); err != nil {
				t.Fatal(err)
			}
			defer c.ConfigSet(ctx, "maxmemory", "0")
			_, err := s.Debit(ctx, "a", []Item{{Limit: l, Key: "{oom}", Cost: 1}})
			return err
		}, true},
		{"cancelled caller", debit(cancelled, "a", one), false},
		{"expired caller", debit(expired, "a", one), false},
		{"stale tag", func(Store) error {
			_, err := NewRedis(c, patient(RedisConfig{Prefix: "e2:", Generations: true})).Debit(ctx, "a", one)
			return err
		}, false},
		{"stale tag in memory", func(Store) error {
			_, err := NewMemory(MemoryConfig{Generations: true}).Debit(ctx, "a", one)
			return err
		}, false},
		{"overloaded", func(Store) error { return fmt.Errorf("weighted: run script: %w", ErrOverloaded) }, false},
		{"overloaded at the caller's deadline", func(Store) error {
			return fmt.Errorf("weighted: run script: %w: %w", ErrOverloaded, context.DeadlineExceeded)
		}, false},
		{"no reply within CallTimeout", func(Store) error {
			return fmt.Errorf("weighted: run script: no reply within 1s: %w (%w)", ErrUnknownOutcome, errCallTimeout)
		}, true},
		{"caller left before the reply", func(Store) error {
			return fmt.Errorf("weighted: run script: %w: %w", ErrUnknownOutcome, context.Canceled)
		}, false},
		{"malformed reply", func(Store) error { return fmt.Errorf("weighted: x: %w", errBadReply) }, true},
		{"closed client", func(Store) error {
			cc := redis.NewClient(&redis.Options{Addr: srv.Addr})
			cc.Close()
			_, err := NewRedis(cc, patient(RedisConfig{})).Debit(ctx, "a", one)
			return err
		}, true},
		// Last: the server goes away.
		{"server down", func(s Store) error {
			srv.Stop(t)
			_, err := s.Debit(ctx, "b", one)
			return err
		}, true},
	}
	for _, tc := range redisCases {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.err(r)
			if err == nil {
				t.Fatal("no error")
			}
			if got := IsStoreFailure(err); got != tc.store {
				t.Fatalf("IsStoreFailure(%v) = %v, want %v", err, got, tc.store)
			}
		})
	}
	if IsStoreFailure(nil) {
		t.Fatal("IsStoreFailure(nil)")
	}
	if IsStoreFailure(errors.New("some other error")) {
		t.Fatal("an unknown error counts as a store failure")
	}
}
