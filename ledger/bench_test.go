package ledger_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/internal/pgtest"
	"github.com/costgate/costgate/ledger"
)

// BenchmarkReserve measures the request-path cost of one reservation: the
// append to the spool. The store is a database that cannot be reached, so
// that the flusher does not compete for the CPU; the spool is large enough
// to hold every record.
//
// p50-ns and p99-ns are the latencies of single calls, timed inside
// b.RunParallel; ns/op is wall time over calls.
func BenchmarkReserve(b *testing.B) {
	for _, c := range []struct {
		name string
		each bool
	}{{"background-fsync", false}, {"sync-each", true}} {
		b.Run(c.name, func(b *testing.B) {
			l := benchLedger(b, c.each)
			var (
				n   atomic.Int64
				mu  sync.Mutex
				lat []time.Duration
			)
			at := time.Now()
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				e := reservation("", at)
				own := make([]time.Duration, 0, 1<<16)
				for pb.Next() {
					e.RequestID = "bench-" + strconv.FormatInt(n.Add(1), 10)
					start := time.Now()
					err := l.Reserve(context.Background(), e)
					own = append(own, time.Since(start))
					if err != nil {
						b.Fatal(err)
					}
				}
				mu.Lock()
				lat = append(lat, own...)
				mu.Unlock()
			})
			b.StopTimer()
			slices.Sort(lat)
			if len(lat) > 0 {
				b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds()), "p50-ns")
				b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds()), "p99-ns")
			}
		})
	}
}

func benchLedger(b *testing.B, each bool) *ledger.Ledger {
	b.Helper()
	l, err := ledger.Open(context.Background(), ledger.Config{
		Dir:          b.TempDir(),
		DSN:          "postgres://nobody@127.0.0.1:1/none?connect_timeout=1",
		SpoolLimit:   8 << 30,
		SyncEach:     each,
		CloseTimeout: time.Millisecond,
	})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { l.Close() })
	return l
}

// BenchmarkPostgresThroughput measures entries per second from Reserve to
// PostgreSQL: each entry is reserved and later settled (two records, as in
// production), and the clock stops when Flush returns. Set
// LEDGER_BENCH_N for the number of entries per run (default b.N).
func BenchmarkPostgresThroughput(b *testing.B) {
	benchThroughput(b, ledger.Config{Dir: b.TempDir(), DSN: pgtest.New(b)})
}

// BenchmarkEmbeddedThroughput is BenchmarkPostgresThroughput on the
// embedded SQLite store (pg-cpu-µs/entry is then other clients' only).
func BenchmarkEmbeddedThroughput(b *testing.B) {
	benchThroughput(b, ledger.Config{Dir: b.TempDir()})
}

func benchThroughput(b *testing.B, cfg ledger.Config) {
	l, err := ledger.Open(context.Background(), cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	n := b.N
	if s := os.Getenv("LEDGER_BENCH_N"); s != "" {
		if n, err = strconv.Atoi(s); err != nil {
			b.Fatal(err)
		}
	}
	ctx := context.Background()
	at := time.Now()
	b.ResetTimer()
	start := time.Now()
	selfCPU0, pgCPU0 := cpuTimes()
	// Settlements trail reservations by 50,000 requests, as responses
	// trail requests (2.5 s of traffic at 20,000 requests/s), so that a
	// settlement lands in a later batch than its reservation: two row
	// writes per entry, the production case.
	const window = 50_000
	for i := range n + window {
		if i < n {
			if err := l.Reserve(ctx, reservation(fmt.Sprintf("t%09d", i), at)); err != nil {
				b.Fatal(err)
			}
		}
		if j := i - window; j >= 0 {
			if err := l.Settle(ctx, settlement(fmt.Sprintf("t%09d", j), costmodel.NanoUSD(j))); err != nil {
				b.Fatal(err)
			}
		}
	}
	if err := l.Flush(ctx); err != nil {
		b.Fatal(err)
	}
	el := time.Since(start)
	selfCPU1, pgCPU1 := cpuTimes()
	b.StopTimer()
	b.ReportMetric(float64(n)/el.Seconds(), "entries/s")
	// CPU per entry, of this process (spool, flusher, pgx) and of every
	// postgres process on the machine (an upper bound for this run's, as
	// other clients count too). On a shared machine these say more than the
	// wall-clock rate: 1e6/(self+pg) is the rate one dedicated core allows.
	b.ReportMetric(float64((selfCPU1-selfCPU0).Microseconds())/float64(n), "self-cpu-µs/entry")
	b.ReportMetric(float64((pgCPU1-pgCPU0).Microseconds())/float64(n), "pg-cpu-µs/entry")
}

// cpuTimes returns the CPU time of this process and the sum over the
// processes named postgres, read from /proc (zero where unreadable).
func cpuTimes() (self, pg time.Duration) {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
		self = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, f := range stats {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		s := string(b)
		open, close := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
		if open < 0 || close < open || s[open+1:close] != "postgres" {
			continue
		}
		fields := strings.Fields(s[close+1:])
		if len(fields) < 13 {
			continue
		}
		ut, _ := strconv.ParseInt(fields[11], 10, 64)
		st, _ := strconv.ParseInt(fields[12], 10, 64)
		pg += time.Duration(ut+st) * 10 * time.Millisecond // USER_HZ is 100 on Linux
	}
	return self, pg
}

// BenchmarkSpend measures a period-to-date spend query, the per-request
// budget check, on a month of data: a tenant with entries from 20 users in
// every 15-minute bucket of 30 days (57,600 entries), beside 2 other tenants
// with the same.
func BenchmarkSpend(b *testing.B) {
	for _, s := range []string{"embedded", "postgres"} {
		b.Run(s, func(b *testing.B) {
			cfg := ledger.Config{Dir: b.TempDir()}
			if s == "postgres" {
				cfg.DSN = pgtest.New(b)
			}
			l, err := ledger.Open(context.Background(), cfg)
			if err != nil {
				b.Fatal(err)
			}
			defer l.Close()
			ctx := context.Background()
			month := time.Date(2026, 6, 1, 0, 0, 0, 0, time.UTC)
			n := 0
			for tenant := range 3 {
				for q := range 30 * 96 {
					for u := range 20 {
						e := reservation(fmt.Sprintf("s%d", n), month.Add(time.Duration(q)*15*time.Minute))
						e.Tenant, e.User = fmt.Sprintf("t%d", tenant), fmt.Sprintf("u%d", u)
						if err := l.Reserve(ctx, e); err != nil {
							b.Fatal(err)
						}
						n++
					}
				}
			}
			fctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
			defer cancel()
			if err := l.Flush(fctx); err != nil {
				b.Fatal(err)
			}
			for _, c := range []struct {
				name string
				q    ledger.SpendQuery
			}{
				{"tenant-month", ledger.SpendQuery{Tenant: "t1", Period: "month", At: month.Add(20 * 24 * time.Hour)}},
				{"tenant-day", ledger.SpendQuery{Tenant: "t1", Period: "day", At: month.Add(20 * 24 * time.Hour)}},
				{"user-month", ledger.SpendQuery{Tenant: "t1", User: "u7", Period: "month", At: month.Add(20 * 24 * time.Hour)}},
			} {
				b.Run(c.name, func(b *testing.B) {
					want := costmodel.NanoUSD(3_000 * 30 * 96 * 20)
					switch c.name {
					case "tenant-day":
						want /= 30
					case "user-month":
						want /= 20
					}
					b.ReportAllocs()
					b.ResetTimer()
					for b.Loop() {
						got, err := l.Spend(ctx, c.q)
						if err != nil {
							b.Fatal(err)
						}
						if got != want {
							b.Fatalf("Spend = %d, want %d", got, want)
						}
					}
				})
			}
		})
	}
}

// BenchmarkSettleDurable measures SettleDurable under 32 concurrent callers
// (the group commit: callers that arrive during one fsync share the next),
// against Settle, which does not wait for an fsync. The store cannot be
// reached, as in BenchmarkReserve. fsyncs/op is the fsyncs per call; p50-ns
// and p99-ns are the latencies of single calls.
func BenchmarkSettleDurable(b *testing.B) {
	for _, c := range []struct {
		name    string
		durable bool
	}{{"settle", false}, {"settle-durable", true}} {
		b.Run(c.name, func(b *testing.B) {
			l := benchLedger(b, false)
			var (
				n   atomic.Int64
				mu  sync.Mutex
				lat []time.Duration
			)
			const callers = 32
			b.SetParallelism((callers + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
			fsyncs := ledger.Fsyncs(l)
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				e := settlement("", 1_234)
				e.Tenant = "acme"
				own := make([]time.Duration, 0, 1<<12)
				for pb.Next() {
					e.RequestID = "bench-" + strconv.FormatInt(n.Add(1), 10)
					start := time.Now()
					var err error
					if c.durable {
						err = l.SettleDurable(context.Background(), e)
					} else {
						err = l.Settle(context.Background(), e)
					}
					own = append(own, time.Since(start))
					if err != nil {
						b.Fatal(err)
					}
				}
				mu.Lock()
				lat = append(lat, own...)
				mu.Unlock()
			})
			b.StopTimer()
			b.ReportMetric(float64(ledger.Fsyncs(l)-fsyncs)/float64(b.N), "fsyncs/op")
			slices.Sort(lat)
			if len(lat) > 0 {
				b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds()), "p50-ns")
				b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds()), "p99-ns")
			}
		})
	}
}

// BenchmarkTallyStorage is what tallies keep in the embedded store: each
// iteration is an hour of the clock in which 10 shapes (10 tenants'
// searches) are each called once a second, a tick entry a call, with a
// fold pass every 10 minutes of the clock (the ledger's runs one every
// minute). -benchtime 24x is a day. It reports the entries the store
// holds (from the roll-up) per shape, those a shape would hold unfolded,
// the database's size with its write-ahead log, and the share of the time
// spent folding (the passes and the flushes that apply their folds).
func BenchmarkTallyStorage(b *testing.B) {
	const shapes = 10
	var clock atomic.Int64
	start := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
	clock.Store(start.UnixMicro())
	cfg := ledger.Config{Dir: b.TempDir(), Now: func() time.Time { return time.UnixMicro(clock.Load()).UTC() }}
	l, err := ledger.Open(context.Background(), cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	ctx := context.Background()
	calls := 0
	var folding time.Duration // in fold passes and the flushes that apply them
	b.ResetTimer()
	begun := time.Now()
	for h := range b.N {
		for s := range 3600 {
			at := start.Add(time.Duration(h)*time.Hour + time.Duration(s)*time.Second)
			for i := range shapes {
				tenant := "t" + strconv.Itoa(i)
				e := ledger.Entry{RequestID: "c", Tenant: tenant, Route: "search", Decision: "allow", Requests: 1,
					KeyDesc: "searches\t0\t1000\t86400000000000\t1000\t0\t{" + tenant + "}:searches\t1", CreatedAt: at}
				if err := l.Tally(ctx, e); err != nil {
					b.Fatal(err)
				}
				calls++
			}
			if s%600 == 599 {
				clock.Store(at.UnixMicro())
				if err := l.Flush(ctx); err != nil {
					b.Fatal(err)
				}
				t := time.Now()
				if _, _, err := ledger.FoldTallies(l); err != nil {
					b.Fatal(err)
				}
				if err := l.Flush(ctx); err != nil {
					b.Fatal(err)
				}
				folding += time.Since(t)
			}
		}
	}
	if err := l.Flush(ctx); err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
	b.ReportMetric(100*folding.Seconds()/time.Since(begun).Seconds(), "%folding")
	sum, err := l.Summary(ctx, "month", cfg.Now())
	if err != nil {
		b.Fatal(err)
	}
	var entries int64
	for _, s := range sum {
		entries += s.Entries
	}
	var size int64
	for _, f := range []string{"ledger.db", "ledger.db-wal"} {
		if st, err := os.Stat(filepath.Join(cfg.Dir, f)); err == nil {
			size += st.Size()
		}
	}
	b.ReportMetric(float64(entries)/shapes, "entries/shape")
	b.ReportMetric(float64(calls)/shapes, "unfolded/shape")
	b.ReportMetric(float64(size)/1e6, "MB")
}

// BenchmarkTally is one call's tally (a counter of its own among
// counters others spread over one shape) with 10 or 5,000 such counters
// in all: 5,000 take several aggregates of the shape (a rate limit
// domain's addresses, tallied under the domain), and a tally should cost
// about what it does with 10.
func BenchmarkTally(b *testing.B) {
	for _, counters := range []int{10, 5000} {
		b.Run(fmt.Sprintf("counters=%d", counters), func(b *testing.B) {
			l, err := ledger.Open(context.Background(), ledger.Config{Dir: b.TempDir()})
			if err != nil {
				b.Fatal(err)
			}
			defer l.Close()
			calls := make([]ledger.Entry, counters)
			for i := range calls {
				calls[i] = tallyCall("x", time.Time{}, "ann", descLine("per-address", fmt.Sprintf("10.0.%d.%d", i/256, i%256), 1))
			}
			ctx := context.Background()
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				if err := l.Tally(ctx, calls[i%counters]); err != nil {
					b.Fatal(err)
				}
				i++
			}
		})
	}
}

// BenchmarkCountsByAmidTallies is one tenant's CountsBy grouping by Desc
// (a restore's read) while 2,000 other tenants' tallies wait for their
// tick: the read looks at every aggregate not yet ticked, under the lock
// every Tally takes.
func BenchmarkCountsByAmidTallies(b *testing.B) {
	l, err := ledger.Open(context.Background(), ledger.Config{Dir: b.TempDir()})
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	ctx := context.Background()
	justAfterATick() // the tallies stay pending for the benchmark's second or so
	now := time.Now()
	for i := range 2000 {
		e := tallyCall("x", now, "ann", descLine("per-address", fmt.Sprintf("10.0.%d.%d", i/256, i%256), 1))
		e.Tenant = "t" + strconv.Itoa(i)
		if err := l.Tally(ctx, e); err != nil {
			b.Fatal(err)
		}
	}
	q := ledger.SpendQuery{Tenant: "t7", From: now.Add(-time.Hour), To: now.Add(time.Hour)}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := l.CountsBy(ctx, q, ledger.GroupBy{Desc: true}); err != nil {
			b.Fatal(err)
		}
	}
}
