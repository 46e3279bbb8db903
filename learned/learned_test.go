package learned

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/costmodel/sketch"
	"github.com/costgate/costgate/internal/redistest"
)

var chat = Key{Tenant: "acme", Model: "gpt-4o-mini", Route: "/v1/chat/completions", Shape: ShapeOf(1024, false, 1)}

// logNormal returns n output lengths of a log-normal law (median about
// 245 tokens) capped at 1024, as chat answers under max_tokens 1024.
func logNormal(seed uint64, n int) []int64 {
	rng := rand.New(rand.NewPCG(seed, seed+1))
	out := make([]int64, n)
	for i := range out {
		out[i] = min(int64(math.Exp(5.5+0.8*rng.NormFloat64())), 1024)
	}
	return out
}

func exact(vals []int64, q float64) int64 {
	s := slices.Clone(vals)
	slices.Sort(s)
	rank := max(min(int(math.Ceil(q*float64(len(s)))), len(s)), 1)
	return s[rank-1]
}

func within(t *testing.T, what string, got, want int64) {
	t.Helper()
	if d := math.Abs(float64(got - want)); d > math.Ceil(sketch.RelativeError*float64(want)) {
		t.Errorf("%s: %d, exact %d: beyond the sketch's %v relative error", what, got, want, sketch.RelativeError)
	}
}

func open(t *testing.T, cfg Config) *Table {
	t.Helper()
	if cfg.Interval == 0 {
		cfg.Interval = time.Hour // tests sync by hand
	}
	cfg.Logf = t.Logf
	tb, err := Open(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tb.Close() })
	return tb
}

func TestEstimateAgainstExactQuantiles(t *testing.T) {
	tb := open(t, Config{MinSamples: 50})
	vals := logNormal(1, 20_000)
	for i, v := range vals {
		tb.Observe(chat, v)
		if i == 48 {
			if e := tb.Estimate(chat, 0.95); e.OK || e.Samples != 49 {
				t.Fatalf("49 samples of 50 needed: %+v, want not OK", e)
			}
		}
	}
	for _, q := range []float64{0.5, 0.9, 0.95, 0.99} {
		e := tb.Estimate(chat, q)
		if !e.OK || e.Samples != uint64(len(vals)) {
			t.Fatalf("q%v: %+v", q, e)
		}
		within(t, "quantile", e.Tokens, exact(vals, q))
	}
}

func TestColdKeysFallBack(t *testing.T) {
	tb := open(t, Config{})
	if e := tb.Estimate(chat, 0.95); e.OK || e.Samples != 0 || e.Tokens != 0 {
		t.Fatalf("a key never seen: %+v", e)
	}
	for range 99 {
		tb.Observe(chat, 10)
	}
	if e := tb.Estimate(chat, 0.95); e.OK {
		t.Fatalf("99 samples, default minimum 100: %+v", e)
	}
	tb.Observe(chat, 10)
	if e := tb.Estimate(chat, 0.95); !e.OK || e.Samples != 100 {
		t.Fatalf("100 samples: %+v", e)
	}
	within(t, "p95 of a constant", tb.Estimate(chat, 0.95).Tokens, 10)
	// The shape is part of the key: tools or another max_tokens bucket
	// learn apart.
	for _, k := range []Key{
		{Tenant: chat.Tenant, Model: chat.Model, Route: chat.Route, Shape: ShapeOf(1024, true, 1)},
		{Tenant: chat.Tenant, Model: chat.Model, Route: chat.Route, Shape: ShapeOf(2048, false, 1)},
		{Tenant: chat.Tenant, Model: chat.Model, Route: "/v1/responses", Shape: chat.Shape},
		{Tenant: chat.Tenant, Model: "gpt-4o", Route: chat.Route, Shape: chat.Shape},
	} {
		if e := tb.Estimate(k, 0.95); e.OK {
			t.Errorf("%s learned from another key: %+v", k, e)
		}
	}
}

func TestShapeBuckets(t *testing.T) {
	for _, c := range []struct{ max, want int64 }{{0, 0}, {-5, 0}, {1, 1}, {2, 2}, {3, 4}, {1000, 1024}, {1024, 1024}, {1025, 2048}, {math.MaxInt64, 1 << 31}} {
		if got := ShapeOf(c.max, false, 1).MaxTokens; got != c.want {
			t.Errorf("ShapeOf(%d) bucket %d, want %d", c.max, got, c.want)
		}
	}
	if !ShapeOf(10, false, 3).Multi || ShapeOf(10, false, 1).Multi {
		t.Error("Multi is outputs > 1")
	}
}

func TestPersistsAcrossRestartsInAFile(t *testing.T) {
	file := filepath.Join(t.TempDir(), "learned.json")
	vals := logNormal(2, 5000)
	a, err := Open(context.Background(), Config{File: file, Interval: time.Hour, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range vals {
		a.Observe(chat, v)
	}
	before := a.Estimate(chat, 0.95)
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	b := open(t, Config{File: file})
	after := b.Estimate(chat, 0.95)
	if after != before || !after.OK {
		t.Fatalf("after a restart %+v, before %+v", after, before)
	}
	within(t, "p95 after a restart", after.Tokens, exact(vals, 0.95))
}

func TestBadFilesAreReportedAndLeftOut(t *testing.T) {
	good := `{"version":1,"relative_error":0.01,"keys":[{"tenant":"acme","model":"m","route":"/r","max_tokens":1024,"buckets":[[-1,100],[300,50]]}]}`
	cases := []struct {
		name, body string
		keys       int // keys loaded
		moved      bool
		why        string
	}{
		{"truncated", good[:len(good)/2], 0, true, "does not parse"},
		{"foreign version", strings.Replace(good, `"version":1`, `"version":7`, 1), 0, true, "version 7"},
		{"another sketch's error", strings.Replace(good, `0.01`, `0.02`, 1), 0, true, "relative error 0.02"},
		{"not JSON", "\x00\x01garbage", 0, true, "does not parse"},
		{"negative count", strings.Replace(good, `[300,50]`, `[300,-50]`, 1), 0, false, "out of range"},
		{"bucket out of range", strings.Replace(good, `[300,50]`, `[99999,50]`, 1), 0, false, "out of range"},
		{"max_tokens not a bucket", strings.Replace(good, `1024`, `1000`, 1), 0, false, "power of two"},
		{"empty tenant", strings.Replace(good, `"acme"`, `""`, 1), 0, false, "empty tenant"},
		{"good", good, 1, false, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			file := filepath.Join(t.TempDir(), "learned.json")
			if err := os.WriteFile(file, []byte(c.body), 0o600); err != nil {
				t.Fatal(err)
			}
			var logs []string
			tb, err := Open(context.Background(), Config{File: file, Interval: time.Hour, Logf: func(f string, a ...any) {
				logs = append(logs, strings.TrimSpace(strings.ReplaceAll(f, "%v", "")))
				logs = append(logs, fmtArgs(a))
			}})
			if err != nil {
				t.Fatalf("a bad file must not stop Open: %v", err)
			}
			defer tb.Close()
			if st := tb.Stats(); st.Keys != c.keys {
				t.Fatalf("%d keys loaded, want %d", st.Keys, c.keys)
			}
			if c.why != "" && !strings.Contains(strings.Join(logs, " "), c.why) {
				t.Errorf("logs %q do not say %q", logs, c.why)
			}
			if _, err := os.Stat(file + ".bad"); (err == nil) != c.moved {
				t.Errorf("moved aside: %v, want %v", err == nil, c.moved)
			}
			if c.keys == 1 {
				k := Key{Tenant: "acme", Model: "m", Route: "/r", Shape: Shape{MaxTokens: 1024}}
				if e := tb.Estimate(k, 0.95); !e.OK || e.Samples != 150 || e.Tokens != int64(math.Ceil(sketch.Value(300))) {
					t.Fatalf("loaded %+v", e)
				}
			}
		})
	}
}

func fmtArgs(a []any) string {
	var b strings.Builder
	for _, x := range a {
		if err, ok := x.(error); ok {
			b.WriteString(err.Error())
		} else if s, ok := x.(string); ok {
			b.WriteString(s)
		}
		b.WriteString(" ")
	}
	return b.String()
}

func TestMergesAcrossReplicasThroughRedis(t *testing.T) {
	srv := redistest.New(t)
	a := open(t, Config{Redis: srv.Client(t)})
	b := open(t, Config{Redis: srv.Client(t)})
	va, vb := logNormal(3, 3000), logNormal(4, 2000)
	for i := range vb {
		vb[i] = min(vb[i]*3, 1024) // replica b sees longer answers
	}
	ctx := context.Background()
	for _, v := range va {
		a.Observe(chat, v)
	}
	// b has never seen the key: a lookup asks for it at the next sync.
	if e := b.Estimate(chat, 0.95); e.OK {
		t.Fatalf("b knows the key before any sync: %+v", e)
	}
	for _, v := range vb {
		b.Observe(chat, v)
	}
	for _, tb := range []*Table{a, b} {
		if err := tb.Sync(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// a reads the key back at the sync after it uses it again.
	a.Estimate(chat, 0.95)
	if err := a.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	all := append(slices.Clone(va), vb...)
	ea, eb := a.Estimate(chat, 0.95), b.Estimate(chat, 0.95)
	if ea != eb || ea.Samples != uint64(len(all)) {
		t.Fatalf("replicas disagree or miss samples: a %+v, b %+v, want %d samples", ea, eb, len(all))
	}
	within(t, "merged p95", ea.Tokens, exact(all, 0.95))
	// Syncing again adds nothing twice.
	for _, tb := range []*Table{a, b, a, b} {
		tb.Estimate(chat, 0.95)
		if err := tb.Sync(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if e := a.Estimate(chat, 0.95); e.Samples != uint64(len(all)) {
		t.Fatalf("after more syncs %d samples, want %d", e.Samples, len(all))
	}

	// A restart of both replicas reads them back from Redis at Open.
	a.Close()
	b.Close()
	c := open(t, Config{Redis: srv.Client(t)})
	if e := c.Estimate(chat, 0.95); e != ea {
		t.Fatalf("after a restart %+v, want %+v", e, ea)
	}
}

func TestBadRedisDataIsLeftOut(t *testing.T) {
	srv := redistest.New(t)
	rc := srv.Client(t)
	ctx := context.Background()
	name := chat.encode()
	if err := rc.HSet(ctx, name, "z", "5", "300", "100", "x", "7", "-3", "1", "99999", "1", "301", "abc", "302", "-4", "0300", "9").Err(); err != nil {
		t.Fatal(err)
	}
	other := Key{Tenant: "beta", Model: "m", Route: "/r"}
	if err := rc.Set(ctx, other.encode(), "not a hash", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if err := rc.HSet(ctx, redisPrefix+"garbage", "1", "1").Err(); err != nil {
		t.Fatal(err)
	}
	tb := open(t, Config{Redis: rc, MinSamples: 10})
	e := tb.Estimate(chat, 0.99)
	if !e.OK || e.Samples != 105 || e.Tokens != int64(math.Ceil(sketch.Value(300))) {
		t.Fatalf("the good buckets: %+v", e)
	}
	if st := tb.Stats(); st.Bad < 8 {
		t.Fatalf("bad data counted %d times, want at least 8 (6 fields, a key of the wrong type, a key name)", st.Bad)
	}
	// Observations of a key Redis refuses are dropped, never retried
	// forever, and the other keys still sync.
	tb.Observe(other, 10)
	tb.Observe(chat, 10)
	if err := tb.Sync(ctx); err != nil {
		t.Fatalf("a refused key failed the whole sync: %v", err)
	}
	if e := tb.Estimate(chat, 0.99); e.Samples != 106 {
		t.Fatalf("after a sync %+v, want 106 samples", e)
	}
}

func TestRedisOutageKeepsObservations(t *testing.T) {
	srv := redistest.New(t)
	tb := open(t, Config{Redis: srv.Client(t), MinSamples: 1})
	ctx := context.Background()
	for range 10 {
		tb.Observe(chat, 100)
	}
	srv.Stop(t)
	sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	if err := tb.Sync(sctx); err == nil {
		t.Fatal("a sync with Redis down succeeded")
	}
	cancel()
	if e := tb.Estimate(chat, 0.5); e.Samples != 10 {
		t.Fatalf("local estimate during the outage: %+v", e)
	}
	srv.Restart(t)
	var err error
	for range 50 { // the client reconnects
		if err = tb.Sync(ctx); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	n, err := srv.Client(t).HGet(ctx, chat.encode(), field(sketch.Index(100))).Int64()
	if err != nil || n != 10 {
		t.Fatalf("Redis holds %d (%v), want the 10 observations made during the outage", n, err)
	}
}

func TestOneTenantCannotTouchAnothers(t *testing.T) {
	tb := open(t, Config{MinSamples: 10, MaxKeysPerTenant: 8, MaxKeys: 100})
	victim := chat
	for range 200 {
		tb.Observe(victim, 500)
	}
	// Names built to collide once joined: a tenant's separator, a model
	// or route spelled with the encoding's characters.
	tricks := []Key{
		{Tenant: "acme|gpt-4o-mini", Model: "/v1/chat/completions", Route: "", Shape: victim.Shape},
		{Tenant: "acm", Model: "e|gpt-4o-mini", Route: victim.Route, Shape: victim.Shape},
		{Tenant: "acme ", Model: victim.Model, Route: victim.Route, Shape: victim.Shape},
		{Tenant: "acme+", Model: victim.Model, Route: victim.Route, Shape: victim.Shape},
		{Tenant: "acme%7C", Model: victim.Model, Route: victim.Route, Shape: victim.Shape},
	}
	seen := map[string]Key{victim.encode(): victim}
	for _, k := range tricks {
		if prev, ok := seen[k.encode()]; ok {
			t.Fatalf("%v and %v share the Redis name %q", k, prev, k.encode())
		}
		seen[k.encode()] = k
		back, err := decodeKey(k.encode())
		if err != nil || back != k {
			t.Fatalf("%v encodes to %q, decoded %v, %v", k, k.encode(), back, err)
		}
	}
	// The attacker floods keys and tiny answers under its own name.
	for i := range 1000 {
		k := Key{Tenant: "mallory", Model: "m" + string(rune('a'+i%26)), Route: victim.Route, Shape: ShapeOf(int64(i), i%2 == 0, 1)}
		tb.Observe(k, 1)
		tb.Observe(Key{Tenant: "mallory", Model: victim.Model, Route: victim.Route, Shape: victim.Shape}, 0)
	}
	if e := tb.Estimate(victim, 0.95); !e.OK || e.Samples != 200 {
		t.Fatalf("the victim's estimate changed: %+v", e)
	}
	within(t, "victim p95", tb.Estimate(victim, 0.95).Tokens, 500)
	if st := tb.Stats(); st.Keys > 9 || st.Dropped == 0 {
		t.Fatalf("mallory holds more than its 8 keys: %+v", st)
	}
	// Another tenant still learns new keys.
	fresh := Key{Tenant: "beta", Model: "m", Route: "/r"}
	tb.Observe(fresh, 7)
	if e := tb.Estimate(fresh, 0.5); e.Samples != 1 {
		t.Fatalf("beta cannot learn once mallory filled its share: %+v", e)
	}
	// Out-of-range observations neither wrap nor go negative.
	k := Key{Tenant: "mallory", Model: victim.Model, Route: victim.Route, Shape: victim.Shape}
	for range 2000 {
		tb.Observe(k, math.MaxInt64)
		tb.Observe(k, -1)
	}
	if e := tb.Estimate(k, 1); e.Tokens < 0 || e.Tokens > sketch.MaxValue+sketch.MaxValue/50 {
		t.Fatalf("estimate of huge answers %+v: out of 0..MaxValue", e)
	}
}

func BenchmarkEstimate(b *testing.B) {
	tb, _ := Open(context.Background(), Config{Interval: time.Hour})
	defer tb.Close()
	for _, v := range logNormal(5, 10_000) {
		tb.Observe(chat, v)
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			tb.Estimate(chat, 0.95)
		}
	})
}

func BenchmarkObserve(b *testing.B) {
	tb, _ := Open(context.Background(), Config{Interval: time.Hour})
	defer tb.Close()
	vals := logNormal(6, 1024)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			tb.Observe(chat, vals[i&1023])
			i++
		}
	})
}

// On Redis Cluster, keys spread over the nodes are all found at Open and
// merged as on one Redis.
func TestRedisCluster(t *testing.T) {
	cl := redistest.NewCluster(t)
	a := open(t, Config{Redis: cl.Client(t), MinSamples: 1})
	ctx := context.Background()
	var keys []Key
	for i := range 30 {
		k := Key{Tenant: fmt.Sprintf("t%d", i), Model: "m", Route: "/r", Shape: ShapeOf(int64(i+1), false, 1)}
		keys = append(keys, k)
		for j := range i + 1 {
			a.Observe(k, int64(j))
		}
	}
	if err := a.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	b := open(t, Config{Redis: cl.Client(t), MinSamples: 1})
	if st := b.Stats(); st.Keys != len(keys) || st.Bad != 0 {
		t.Fatalf("read %+v at Open, want %d keys", st, len(keys))
	}
	for i, k := range keys {
		if e := b.Estimate(k, 1); e.Samples != uint64(i+1) {
			t.Fatalf("%v: %+v, want %d samples", k, e, i+1)
		}
	}
}

func TestKeyOf(t *testing.T) {
	est := costmodel.Estimate{Model: "gpt-4o-2024-08-06", MaxOutputTokens: 700, OutputCap: 1400, Outputs: 2, Tools: true}
	k, ok := KeyOf("acme", "/v1/chat/completions", "gpt-4o", &est)
	want := Key{Tenant: "acme", Model: "gpt-4o", Route: "/v1/chat/completions", Shape: Shape{MaxTokens: 1024, Tools: true, Multi: true}}
	if !ok || k != want {
		t.Fatalf("KeyOf: %+v %v, want %+v", k, ok, want)
	}
	// Every model the price table does not know shares one key.
	for _, name := range []string{"made-up-1", "made-up-2"} {
		u := costmodel.Estimate{Model: name, UnknownModel: true, OutputCap: 100, Outputs: 1}
		if k, _ := KeyOf("acme", "/r", name, &u); k.Model != UnknownModel {
			t.Fatalf("unknown model %q keyed as %q", name, k.Model)
		}
	}
	for _, e := range []costmodel.Estimate{
		{OutputCap: 0},
		{OutputCap: 100, Usage: costmodel.Usage{AudioOutputTokens: 100}},
		{OutputCap: 100, Stream: true, Uncounted: true},
	} {
		if _, ok := KeyOf("acme", "/r", "m", &e); ok {
			t.Errorf("%+v is learned", e)
		}
	}
}
