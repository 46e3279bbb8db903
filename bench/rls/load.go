package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// A caller makes one rate limit decision: one RPC for key index key, on
// behalf of load worker worker. It reports whether the server refused
// (over the limit); an error is a failed RPC or a malformed answer, never a
// refusal. Implementations must be safe for concurrent use.
type caller interface {
	call(ctx context.Context, worker, key int) (overLimit bool, err error)
}

// loadConfig is one run's shape.
type loadConfig struct {
	Concurrency int           // workers, each with at most one call in flight (gRPC streams)
	Rate        float64       // decisions per second offered, spread over the workers; 0: closed loop
	Keys        int           // distinct key indexes, spread over the calls
	Warmup      time.Duration // calls before the measured window, not counted
	Duration    time.Duration // the measured window
	CallTimeout time.Duration // deadline of each call
	ServerPID   int           // process whose CPU is the server's; 0: not measured
	StorePID    int           // process whose CPU is the store's (Redis); 0: none
}

// Result is what one run measured, over the measured window only.
type Result struct {
	Target      string  `json:"target"`
	Descriptors int     `json:"descriptors"`
	Concurrency int     `json:"conc"`
	Rate        float64 `json:"rate,omitempty"` // offered decisions/s; 0: closed loop
	Conns       int     `json:"conns"`
	Keys        int     `json:"keys"`
	Decisions   uint64  `json:"decisions"`  // calls answered, allowed or refused
	OverLimit   uint64  `json:"over_limit"` // of which refused
	Errors      uint64  `json:"errors"`     // failed calls, not decisions
	Seconds     float64 `json:"seconds"`    // length of the window
	PerSecond   float64 `json:"decisions_per_s"`
	// CPU per decision, µs: the server's (schedstat: its threads' time on
	// a CPU), the same from utime+stime (10 ms ticks, a cross-check), the
	// store's and the load generator's own. Nil when not measured (no
	// server or store PID).
	ServerCPU     *float64 `json:"cpu_us_per_decision,omitempty"`
	ServerCPUStat *float64 `json:"cpu_stat_us_per_decision,omitempty"`
	StoreCPU      *float64 `json:"store_cpu_us_per_decision,omitempty"`
	ClientCPU     float64  `json:"client_cpu_us_per_decision"`
	P50           float64  `json:"p50_ms"`
	P90           float64  `json:"p90_ms"`
	P99           float64  `json:"p99_ms"`
	Max           float64  `json:"max_ms"`
	// Load1 is the 1-minute load average at the end of the window (from
	// /proc/loadavg; this run's own processes count in it).
	Load1      string `json:"load1"`
	FirstError string `json:"first_error,omitempty"`
}

// A worker's counts, kept apart so that workers share no cache line.
type workerStats struct {
	hist     histogram
	over     uint64
	errs     uint64
	firstErr error
}

const (
	phaseWarmup int32 = iota
	phaseMeasure
	phaseDone
)

// drive runs the load: cfg.Concurrency workers call c, in a closed loop
// (each calls again as soon as it has its answer) or, with cfg.Rate, each
// at its share of the rate; worker w's n-th call is on key index
// (n*Concurrency + w) % Keys. It runs for cfg.Warmup and then cfg.Duration,
// and measures the second window: calls answered in it, their latency
// (from the call, or from when it was due if it was made late, to its
// answer), and the CPU time the server, store and this process used. A
// call is counted in the window in which it was answered. It returns an error only when the load could
// not be run, or when no call in the window got an answer.
func drive(ctx context.Context, cfg loadConfig, c caller) (Result, error) {
	var res Result
	if cfg.Concurrency < 1 || cfg.Keys < 1 || cfg.Duration <= 0 || cfg.Rate < 0 {
		return res, fmt.Errorf("load: concurrency %d, keys %d, duration %v, rate %v: want all positive (rate 0: closed loop)",
			cfg.Concurrency, cfg.Keys, cfg.Duration, cfg.Rate)
	}
	// One call first: a server that is not there is an error, not a run of
	// failures.
	probe, cancel := context.WithTimeout(ctx, 10*time.Second)
	_, err := c.call(probe, 0, 0)
	cancel()
	if err != nil {
		return res, fmt.Errorf("load: first call: %w", err)
	}

	callCtx, stopCalls := context.WithCancel(ctx)
	defer stopCalls()
	var phase atomic.Int32
	stats := make([]*workerStats, cfg.Concurrency)
	var wg sync.WaitGroup
	for w := range cfg.Concurrency {
		st := &workerStats{}
		stats[w] = st
		wg.Go(func() {
			key := w % cfg.Keys
			step := cfg.Concurrency % cfg.Keys
			// With a rate, worker w's calls are due every interval, the
			// workers' schedules staggered. A call made late because the
			// worker's last call was still waiting for its answer counts
			// from when it was due, so a server that falls behind is
			// charged for the wait (no coordinated omission); a call the
			// worker waited for counts from when it was sent, since its
			// timer's late wake-up (up to a millisecond: the runtime's
			// poller sleeps in whole milliseconds) is this process's.
			var interval time.Duration
			var due time.Time
			if cfg.Rate > 0 {
				interval = time.Duration(float64(cfg.Concurrency) / cfg.Rate * float64(time.Second))
				due = time.Now().Add(interval * time.Duration(w) / time.Duration(cfg.Concurrency))
			}
			for {
				start := time.Now()
				if interval > 0 {
					if wait := due.Sub(start); wait > 0 {
						t := time.NewTimer(wait)
						select {
						case <-t.C:
						case <-callCtx.Done():
							t.Stop()
							return
						}
						start = time.Now()
					} else {
						start = due
					}
					due = due.Add(interval)
				}
				cctx, cancel := callCtx, context.CancelFunc(nil)
				if cfg.CallTimeout > 0 {
					cctx, cancel = context.WithTimeout(callCtx, cfg.CallTimeout)
				}
				over, err := c.call(cctx, w, key)
				d := time.Since(start)
				if cancel != nil {
					cancel()
				}
				switch phase.Load() {
				case phaseMeasure:
					if err != nil {
						st.errs++
						if st.firstErr == nil {
							st.firstErr = err
						}
					} else {
						st.hist.record(d)
						if over {
							st.over++
						}
					}
				case phaseDone:
					return
				}
				if err != nil && callCtx.Err() != nil {
					return
				}
				key += step
				if key >= cfg.Keys {
					key -= cfg.Keys
				}
			}
		})
	}

	wait := func(d time.Duration) error {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	finish := func() {
		phase.Store(phaseDone)
		stopCalls()
		wg.Wait()
	}
	if err := wait(cfg.Warmup); err != nil {
		finish()
		return res, err
	}
	pids := []int{cfg.ServerPID, cfg.StorePID, os.Getpid()}
	before := make([]cpuSample, len(pids))
	for i, pid := range pids {
		if pid > 0 {
			if before[i], err = readCPU(pid); err != nil {
				finish()
				return res, err
			}
		}
	}
	t0 := time.Now()
	phase.Store(phaseMeasure)
	err = wait(cfg.Duration)
	phase.Store(phaseDone)
	elapsed := time.Since(t0)
	after := make([]cpuSample, len(pids))
	var cpuErr error
	for i, pid := range pids {
		if pid > 0 {
			if after[i], cpuErr = readCPU(pid); cpuErr != nil {
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		if f := strings.Fields(string(b)); len(f) > 0 {
			res.Load1 = f[0]
		}
	}
	finish()
	if err != nil {
		return res, err
	}
	if cpuErr != nil {
		return res, cpuErr
	}

	var h histogram
	for _, st := range stats {
		h.merge(&st.hist)
		res.OverLimit += st.over
		res.Errors += st.errs
		if st.firstErr != nil && res.FirstError == "" {
			res.FirstError = st.firstErr.Error()
		}
	}
	res.Concurrency = cfg.Concurrency
	res.Rate = cfg.Rate
	res.Keys = cfg.Keys
	res.Decisions = h.n
	res.Seconds = elapsed.Seconds()
	res.PerSecond = float64(h.n) / elapsed.Seconds()
	ms := func(d time.Duration) float64 { return float64(d) / 1e6 }
	res.P50, res.P90, res.P99, res.Max = ms(h.quantile(0.50)), ms(h.quantile(0.90)), ms(h.quantile(0.99)), ms(h.max)
	if h.n == 0 {
		return res, errors.New("load: no call was answered in the measured window: " + res.FirstError)
	}
	perDecision := func(d time.Duration) *float64 {
		us := float64(d) / 1e3 / float64(h.n)
		return &us
	}
	server, store, self := after[0].sub(before[0]), after[1].sub(before[1]), after[2].sub(before[2])
	if cfg.ServerPID > 0 {
		res.ServerCPU, res.ServerCPUStat = perDecision(server.Sched), perDecision(server.Stat)
	}
	if cfg.StorePID > 0 {
		res.StoreCPU = perDecision(store.Sched)
	}
	res.ClientCPU = *perDecision(self.Sched)
	return res, nil
}
