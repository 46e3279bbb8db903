package rls_test

import (
	"context"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/costgate/costgate/rls"
	"github.com/costgate/costgate/weighted"
)

// TestDecisionsAreFinal checks that a debit by an RLS decision is final in
// the limiter store: one script call per decision (no settlement after
// it), and no reservation record kept longer than weighted.FinalRecordTTL
// (a settled one is remembered for the store's SettleTTL, ten minutes by
// default, one key per decision).
func TestDecisionsAreFinal(t *testing.T) {
	e := newEnv(t, testConfig, true, rls.Options{})
	opt, err := redis.ParseURL(e.redis.URL)
	if err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(opt)
	defer c.Close()
	ctx := context.Background()
	scripts := func() int64 {
		info, err := c.Info(ctx, "commandstats").Result()
		if err != nil {
			t.Fatal(err)
		}
		var n int64
		for _, line := range strings.Split(info, "\n") {
			for _, cmd := range []string{"cmdstat_evalsha:calls=", "cmdstat_eval:calls="} {
				if rest, ok := strings.CutPrefix(strings.TrimSpace(line), cmd); ok {
					v, _ := strconv.ParseInt(rest[:strings.IndexByte(rest, ',')], 10, 64)
					n += v
				}
			}
		}
		return n
	}
	// Warm up: the first decision on a tag may restore its generation.
	e.ask(t, "edge", 0, d("remote_address", "198.51.100.9"), d("tenant", "globex"))
	before := scripts()
	const decisions = 3 // per-ip admits 4 a minute
	for i := range decisions {
		if resp := e.ask(t, "edge", 0, d("remote_address", "198.51.100.9"), d("tenant", "globex")); resp.GetOverallCode() != OK {
			t.Fatalf("decision %d: %s", i, codes_(resp))
		}
	}
	if e.redis.Private() {
		if got := scripts() - before; got != decisions {
			t.Errorf("%d script calls for %d decisions, want one each", got, decisions)
		}
	}
	keys, err := c.Keys(ctx, "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	records := 0
	for _, k := range keys {
		if !strings.Contains(k, "r:{") {
			continue
		}
		records++
		ttl, err := c.PTTL(ctx, k).Result()
		if err != nil {
			t.Fatal(err)
		}
		if ttl <= 0 || ttl > weighted.FinalRecordTTL {
			t.Errorf("record %s: TTL %s, want within (0, %s]", k, ttl, weighted.FinalRecordTTL)
		}
	}
	if records == 0 {
		t.Errorf("no reservation record among %v: the per-ip fixed window should write one for each decision", keys)
	}
}
