package weighted

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestParseAlgorithm(t *testing.T) {
	for a := Algorithm(0); a < numAlgorithms; a++ {
		got, err := ParseAlgorithm(a.String())
		if err != nil || got != a {
			t.Fatalf("ParseAlgorithm(%q) = %v, %v", a.String(), got, err)
		}
	}
	if _, err := ParseAlgorithm("leaky"); err == nil {
		t.Fatal("unknown algorithm accepted")
	}
	if s := Algorithm(99).String(); s != "Algorithm(99)" {
		t.Fatalf("String of an unknown algorithm: %q", s)
	}
}

func TestValidate(t *testing.T) {
	ok := Limit{Name: "l", Rate: 10, Period: time.Second}
	cases := map[string]struct {
		change func(*Limit)
		valid  bool
	}{
		"plain":                      {func(*Limit) {}, true},
		"burst above rate":           {func(l *Limit) { l.Burst = 50 }, true},
		"empty name":                 {func(l *Limit) { l.Name = "" }, false},
		"colon in name":              {func(l *Limit) { l.Name = "a:b" }, false},
		"brace in name":              {func(l *Limit) { l.Name = "{a}" }, false},
		"zero rate":                  {func(l *Limit) { l.Rate = 0 }, false},
		"zero period":                {func(l *Limit) { l.Period = 0 }, false},
		"sub-microsecond period":     {func(l *Limit) { l.Period = 1500 * time.Nanosecond }, false},
		"period too long":            {func(l *Limit) { l.Period = MaxPeriod + time.Second }, false},
		"negative burst":             {func(l *Limit) { l.Burst = -1 }, false},
		"unknown algorithm":          {func(l *Limit) { l.Algorithm = 42 }, false},
		"burst on a window":          {func(l *Limit) { l.Algorithm, l.Burst = FixedWindow, 20 }, false},
		"burst equal to rate":        {func(l *Limit) { l.Algorithm, l.Burst = SlidingLog, 10 }, true},
		"a day of nano-dollars":      {func(l *Limit) { l.Rate, l.Period = 100_000_000_000, 24*time.Hour }, true},
		"too fine to count exactly":  {func(l *Limit) { l.Rate, l.Period = 1<<50, 3*time.Microsecond }, false},
		"a month of tokens, sliding": {func(l *Limit) { l.Algorithm, l.Rate, l.Period = SlidingWindow, 1_000_000_000, 30*24*time.Hour }, true},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			l := ok
			tc.change(&l)
			if err := l.Validate(); (err == nil) != tc.valid {
				t.Fatalf("Validate(%+v) = %v, want valid %v", l, err, tc.valid)
			}
		})
	}
	s, _ := Limit{Name: "l", Rate: 100_000_000_000, Period: 24 * time.Hour}.spec()
	if s.tick != 10_000_000 || s.p != 8640 {
		t.Fatalf("a day of 10^11 units counts in ticks of %dµs, %d a period; want 10s, 8640", s.tick, s.p)
	}
}

// TestConfigChange changes a limit's rate, burst and period between debits
// and checks that the state carries over, the same on both stores.
func TestConfigChange(t *testing.T) {
	c := testRedis(t)
	ctx := context.Background()
	for _, s := range bothStores(c, newClock()) {
		t.Run(s.name, func(t *testing.T) {
			clk := newClock()
			if r, ok := s.Store.(*Redis); ok {
				r.now = clk.Now
			} else {
				s.Store = NewMemory(MemoryConfig{Now: clk.Now})
			}
			l := Limit{Name: "tokens", Rate: 10, Period: time.Second, Burst: 10}
			debit := func(l Limit, cost int64) ItemState {
				t.Helper()
				res, err := s.Debit(ctx, "r", []Item{{Limit: l, Key: "k", Cost: cost}})
				if err != nil {
					t.Fatal(err)
				}
				return res.Items[0]
			}
			if st := debit(l, 8); !st.Allowed || st.Remaining != 2 {
				t.Fatalf("first debit: %+v", st)
			}
			// A smaller burst: the 8 units used are more than it holds; they
			// stay owed (up to two bursts), so one more unit waits until 4
			// are back.
			l.Burst = 5
			if st := debit(l, 1); st.Allowed || st.Remaining != 0 || st.RetryAfter != 400*time.Millisecond {
				t.Fatalf("after shrinking the burst: %+v", st)
			}
			// A longer period rescales the debt (8 units) to it: refilling
			// 10 units per 2s, one unit takes 200ms, so after 800ms 4 are
			// owed and one more fits, leaving nothing.
			l.Period = 2 * time.Second
			clk.Advance(800 * time.Millisecond)
			if st := debit(l, 1); !st.Allowed || st.Remaining != 0 {
				t.Fatalf("after lengthening the period: %+v", st)
			}
			// A new algorithm starts from fresh state.
			l.Algorithm = GCRA
			if st := debit(l, 5); !st.Allowed {
				t.Fatalf("a new algorithm does not start fresh: %+v", st)
			}
		})
	}
}

// FuzzLimit checks that no limit, valid or not, makes a store panic, and
// that a valid one refuses a cost above its capacity with a *CostError.
func FuzzLimit(f *testing.F) {
	f.Add("tokens", uint8(0), int64(1000), int64(time.Minute), int64(0), int64(10))
	f.Add("w", uint8(3), int64(5), int64(time.Second), int64(5), int64(6))
	f.Add("c", uint8(5), int64(1), int64(1000), int64(0), int64(1))
	f.Add("x:y", uint8(9), int64(-1), int64(-5), int64(-1), int64(-1))
	f.Fuzz(func(t *testing.T, name string, algo uint8, rate, period, burst, cost int64) {
		l := Limit{Name: name, Algorithm: Algorithm(algo), Rate: rate, Period: time.Duration(period), Burst: burst}
		m := NewMemory(MemoryConfig{Now: func() time.Time { return start }})
		res, err := m.Debit(context.Background(), "r", []Item{{Limit: l, Key: "k", Cost: cost}})
		if verr := l.Validate(); verr != nil {
			if err == nil {
				t.Fatalf("invalid limit %+v (%v) debited: %+v", l, verr, res)
			}
			return
		}
		switch {
		case cost < 0:
			if err == nil {
				t.Fatal("negative cost debited")
			}
		case cost > l.Capacity():
			if !errors.Is(err, ErrCostExceedsCapacity) {
				t.Fatalf("cost %d above capacity %d: %v", cost, l.Capacity(), err)
			}
		case err != nil || !res.Allowed || res.Items[0].Remaining != l.Capacity()-cost:
			t.Fatalf("first debit of %d on %+v: %+v %v", cost, l, res, err)
		}
	})
}

// FuzzParseAlgorithm checks that ParseAlgorithm accepts exactly the names
// String returns.
func FuzzParseAlgorithm(f *testing.F) {
	for a := Algorithm(0); a < numAlgorithms; a++ {
		f.Add(a.String())
	}
	f.Add("Token_Bucket")
	f.Add("")
	f.Fuzz(func(t *testing.T, s string) {
		a, err := ParseAlgorithm(s)
		if err != nil {
			return
		}
		if a >= numAlgorithms || a.String() != s {
			t.Fatalf("ParseAlgorithm(%q) = %v, whose name is %q", s, a, a.String())
		}
	})
}
