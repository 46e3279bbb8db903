// Command proxyload is the load benchmark of costgate's data plane (see
// bench/proxy.sh, which runs it, and bench/README.md, section "proxy").
//
// It has four roles, each its own process so that each one's CPU time can
// be read apart from the others':
//
//	proxyload upstream -addr-file F         a stub OpenAI upstream: one fixed chat completion with usage
//	proxyload bare -upstream URL -addr-file F  a bare httputil.ReverseProxy (buffer pool, large keep-alive pool)
//	proxyload load -url URL -label L ...    a load generator (closed loop, or open with -rate); prints one JSON line per run
//	proxyload report FILE                   medians and ratios of the JSON lines, as Markdown
//
// The load generator keeps -c connections busy, each sending a short chat
// completion request as soon as the previous answer has been read; with
// -rate it offers a fixed rate instead, spread over the connections, and
// counts each latency from the time its request was due. After a
// warm-up it measures for -d: requests completed, their latencies, and the
// CPU time (utime+stime from /proc/PID/stat) that every process named in
// -pids used during the measured window, itself included. With -metrics it
// also reads costgate's costgate_decision_duration_seconds histograms
// before and after the window.
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: proxyload upstream|bare|load|report|freeport [flags]")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "upstream":
		err = runUpstream(os.Args[2:])
	case "bare":
		err = runBare(os.Args[2:])
	case "load":
		err = runLoad(os.Args[2:])
	case "report":
		err = runReport(os.Args[2:])
	case "freeport":
		err = freePort()
	default:
		err = fmt.Errorf("unknown role %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "proxyload:", err)
		os.Exit(1)
	}
}

// stubReply is the upstream's answer to every request: a short chat
// completion with the usage costgate settles from.
const stubReply = `{"id":"chatcmpl-bench","object":"chat.completion","created":1764500000,"model":"gpt-4o-mini",` +
	`"choices":[{"index":0,"message":{"role":"assistant","content":"Hello! How can I help you today?"},"finish_reason":"stop"}],` +
	`"usage":{"prompt_tokens":14,"completion_tokens":9,"total_tokens":23}}`

// listen listens on a free loopback port and writes the address to file.
func listen(file string) (net.Listener, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	if file != "" {
		// Written whole under another name, then renamed, so that a reader
		// never sees a partial address.
		if err := os.WriteFile(file+".tmp", []byte(ln.Addr().String()), 0o644); err != nil {
			ln.Close()
			return nil, err
		}
		if err := os.Rename(file+".tmp", file); err != nil {
			ln.Close()
			return nil, err
		}
	}
	return ln, nil
}

func runUpstream(args []string) error {
	fs := flag.NewFlagSet("upstream", flag.ContinueOnError)
	addrFile := fs.String("addr-file", "", "write the listen address here")
	if err := fs.Parse(args); err != nil {
		return err
	}
	ln, err := listen(*addrFile)
	if err != nil {
		return err
	}
	reply := []byte(stubReply)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", strconv.Itoa(len(reply)))
		w.Header().Set("X-Request-Id", "stub")
		_, _ = w.Write(reply)
	})
	return (&http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}).Serve(ln)
}

// bufferPool lends the 32 KiB buffers ReverseProxy copies bodies through.
type bufferPool struct{ p sync.Pool }

func (b *bufferPool) Get() []byte {
	if v, ok := b.p.Get().(*[]byte); ok {
		return *v
	}
	return make([]byte, 32<<10)
}

func (b *bufferPool) Put(buf []byte) { b.p.Put(&buf) }

func runBare(args []string) error {
	fs := flag.NewFlagSet("bare", flag.ContinueOnError)
	addrFile := fs.String("addr-file", "", "write the listen address here")
	upstream := fs.String("upstream", "", "the upstream's base URL")
	if err := fs.Parse(args); err != nil {
		return err
	}
	target, err := url.Parse(*upstream)
	if err != nil || target.Host == "" {
		return fmt.Errorf("bare: bad -upstream %q", *upstream)
	}
	ln, err := listen(*addrFile)
	if err != nil {
		return err
	}
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) { pr.SetURL(target) },
		Transport: &http.Transport{
			DialContext:         (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
			MaxIdleConns:        1024,
			MaxIdleConnsPerHost: 512,
			IdleConnTimeout:     90 * time.Second,
		},
		BufferPool: &bufferPool{},
	}
	return (&http.Server{Handler: rp, ReadHeaderTimeout: 10 * time.Second}).Serve(ln)
}

// freePort prints a loopback TCP port that was free a moment ago.
func freePort() error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	defer ln.Close()
	fmt.Println(ln.Addr().(*net.TCPAddr).Port)
	return nil
}

// Run is one measured run, printed as one JSON line.
type Run struct {
	Label       string  `json:"label"`
	Round       int     `json:"round"`
	Conns       int     `json:"conns"`
	Rate        float64 `json:"rate,omitempty"` // the open loop's offered req/s; 0: closed loop
	Seconds     float64 `json:"seconds"`
	Requests    int64   `json:"requests"`
	RPS         float64 `json:"rps"`
	P50us       float64 `json:"p50_us"`
	P90us       float64 `json:"p90_us"`
	P99us       float64 `json:"p99_us"`
	Non200      int64   `json:"non_200"`
	Errors      int64   `json:"errors"`
	Degraded    int64   `json:"degraded"` // answers with Costgate-Degraded: the store was skipped
	LoadAvg     string  `json:"loadavg"`  // /proc/loadavg at the end of the window
	FirstError  string  `json:"first_error,omitempty"`
	FirstStatus string  `json:"first_non_200,omitempty"`

	// CPUus is CPU time per measured request, in µs, by process name.
	CPUus map[string]float64 `json:"cpu_us_per_req"`
	// Stages is the mean wall time per request of each costgate stage, in
	// µs, from the decision-duration histograms (sum/count over the
	// window); Counts is how many observations each had.
	Stages map[string]float64 `json:"stage_us,omitempty"`
	Counts map[string]float64 `json:"stage_count,omitempty"`
}

// request is the body every request sends: a short prompt.
const request = `{"model":"gpt-4o-mini","max_tokens":16,"messages":[{"role":"user","content":"Say hello to the benchmark."}]}`

func runLoad(args []string) error {
	fs := flag.NewFlagSet("load", flag.ContinueOnError)
	target := fs.String("url", "", "the proxy's base URL")
	label := fs.String("label", "", "the run's label in the output")
	round := fs.Int("round", 0, "the run's round number in the output")
	conns := fs.Int("c", 32, "connections, each with one request in flight")
	warmup := fs.Duration("warmup", time.Second, "load before the measured window")
	dur := fs.Duration("d", 4*time.Second, "the measured window")
	key := fs.String("key", "cg-bench", "the API key sent as a bearer token")
	pids := fs.String("pids", "", "processes to measure the CPU of: name=pid,name=pid")
	metrics := fs.String("metrics", "", "costgate's admin /metrics URL, read before and after the window")
	adminToken := fs.String("admin-token", "", "bearer token for -metrics")
	rate := fs.Float64("rate", 0, "open loop: requests per second in all, spread evenly over the connections (0: closed loop)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *rate < 0 || *conns < 1 {
		return fmt.Errorf("-rate must not be negative and -c must be at least 1")
	}
	procs, err := parsePids(*pids)
	if err != nil {
		return err
	}
	endpoint := strings.TrimSuffix(*target, "/") + "/v1/chat/completions"
	tr := &http.Transport{MaxIdleConns: *conns, MaxIdleConnsPerHost: *conns, MaxConnsPerHost: *conns, DisableCompression: true}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	body := []byte(request)

	// phase: 0 warm-up, 1 measuring, 2 stop. Only requests that end while
	// measuring are counted.
	var phase atomic.Int32
	var non200, errs, degraded atomic.Int64
	var firstErr, firstStatus atomic.Value
	lat := make([][]time.Duration, *conns)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range *conns {
		lat[i] = make([]time.Duration, 0, 1<<16)
		// In the open loop, connection i sends its k-th request at start +
		// (k + i/conns) × conns/rate, or as soon as its previous answer is in
		// when that is later; the latency counts from the scheduled time,
		// so that a slow answer is not hidden by the requests it delayed.
		var every time.Duration
		if *rate > 0 {
			every = time.Duration(float64(*conns) / *rate * float64(time.Second))
		}
		next := start.Add(every * time.Duration(i) / time.Duration(*conns))
		wg.Go(func() {
			for phase.Load() < 2 {
				t0 := time.Now()
				if every > 0 {
					if d := time.Until(next); d > 0 {
						time.Sleep(d)
					}
					t0, next = next, next.Add(every)
				}
				req, _ := http.NewRequest(http.MethodPost, endpoint, bytes.NewReader(body))
				req.Header.Set("Authorization", "Bearer "+*key)
				req.Header.Set("Content-Type", "application/json")
				resp, err := client.Do(req)
				if err != nil {
					if phase.Load() == 1 {
						errs.Add(1)
						firstErr.CompareAndSwap(nil, err.Error())
					}
					time.Sleep(10 * time.Millisecond) // bounded back-off; the loop ends with the phase
					continue
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				d := time.Since(t0)
				if phase.Load() != 1 {
					continue
				}
				lat[i] = append(lat[i], d)
				if resp.StatusCode != http.StatusOK {
					non200.Add(1)
					firstStatus.CompareAndSwap(nil, fmt.Sprintf("%d %s", resp.StatusCode, bytes.TrimSpace(b)))
				}
				if resp.Header.Get("Costgate-Degraded") != "" {
					degraded.Add(1)
				}
			}
		})
	}

	time.Sleep(*warmup)
	m0, err := scrape(*metrics, *adminToken)
	if err != nil {
		phase.Store(2)
		wg.Wait()
		return err
	}
	c0 := cpuTimes(procs)
	t0 := time.Now()
	phase.Store(1)
	time.Sleep(*dur)
	phase.Store(2)
	elapsed := time.Since(t0)
	c1 := cpuTimes(procs)
	loadavg, _ := os.ReadFile("/proc/loadavg")
	wg.Wait()
	m1, err := scrape(*metrics, *adminToken)
	if err != nil {
		return err
	}

	var all []time.Duration
	for _, l := range lat {
		all = append(all, l...)
	}
	slices.Sort(all)
	n := int64(len(all))
	run := Run{
		Label: *label, Round: *round, Conns: *conns, Rate: *rate, Seconds: elapsed.Seconds(),
		Requests: n, RPS: float64(n) / elapsed.Seconds(),
		P50us: us(quantile(all, 0.50)), P90us: us(quantile(all, 0.90)), P99us: us(quantile(all, 0.99)),
		Non200: non200.Load(), Errors: errs.Load(), Degraded: degraded.Load(),
		LoadAvg: strings.Join(strings.Fields(string(loadavg))[:3], " "),
		CPUus:   map[string]float64{},
	}
	if v, ok := firstErr.Load().(string); ok {
		run.FirstError = v
	}
	if v, ok := firstStatus.Load().(string); ok {
		run.FirstStatus = v
	}
	for name := range c0 {
		if n > 0 {
			run.CPUus[name] = float64(c1[name]-c0[name]) / float64(time.Microsecond) / float64(n)
		}
	}
	if m0 != nil {
		run.Stages, run.Counts = map[string]float64{}, map[string]float64{}
		for stage, h1 := range m1 {
			h0 := m0[stage]
			if c := h1.count - h0.count; c > 0 {
				run.Stages[stage] = (h1.sum - h0.sum) / c * 1e6
				run.Counts[stage] = c
			}
		}
	}
	return json.NewEncoder(os.Stdout).Encode(run)
}

func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

// quantile is the q-quantile of sorted durations (nearest rank).
func quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(q*float64(len(sorted))+0.5) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// parsePids reads name=pid,name=pid; the name "self" is the load generator.
func parsePids(s string) (map[string]int, error) {
	procs := map[string]int{"loadgen": os.Getpid()}
	for f := range strings.SplitSeq(s, ",") {
		if f == "" {
			continue
		}
		name, pid, ok := strings.Cut(f, "=")
		n, err := strconv.Atoi(pid)
		if !ok || err != nil || n <= 0 {
			return nil, fmt.Errorf("bad -pids entry %q: want name=pid", f)
		}
		procs[name] = n
	}
	return procs, nil
}

// clockTick is USER_HZ, the unit of utime and stime in /proc/PID/stat; it is
// 100 on every Linux architecture Go supports.
const clockTick = 10 * time.Millisecond

// cpuTimes reads utime+stime of each process; a process that cannot be
// read counts -1 ns, which makes its figure obviously wrong.
func cpuTimes(procs map[string]int) map[string]time.Duration {
	out := make(map[string]time.Duration, len(procs))
	for name, pid := range procs {
		out[name] = -1
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		// The command name (field 2) may hold spaces; fields after its
		// closing parenthesis are plain. utime and stime are fields 14
		// and 15, so the 12th and 13th after it.
		i := bytes.LastIndexByte(b, ')')
		f := strings.Fields(string(b[i+1:]))
		if len(f) < 13 {
			continue
		}
		ut, err1 := strconv.ParseInt(f[11], 10, 64)
		st, err2 := strconv.ParseInt(f[12], 10, 64)
		if err1 == nil && err2 == nil {
			out[name] = time.Duration(ut+st) * clockTick
		}
	}
	if self := out["loadgen"]; self >= 0 {
		// Our own CPU to the nanosecond rather than the tick.
		var ru syscall.Rusage
		if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
			out["loadgen"] = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
		}
	}
	return out
}

type hist struct{ sum, count float64 }

var stageLine = regexp.MustCompile(`^costgate_decision_duration_seconds_(sum|count)\{(?:.*,)?stage="([a-z]+)"(?:,.*)?\} ([0-9.eE+-]+)`)

// scrape reads the decision-duration histograms by stage; a "" URL reads
// nothing.
func scrape(u, token string) (map[string]hist, error) {
	if u == "" {
		return nil, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("metrics: status %s", resp.Status)
	}
	out := map[string]hist{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		m := stageLine.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		v, err := strconv.ParseFloat(m[3], 64)
		if err != nil {
			continue
		}
		h := out[m[2]]
		if m[1] == "sum" {
			h.sum += v
		} else {
			h.count += v
		}
		out[m[2]] = h
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	if len(out) == 0 {
		return nil, errors.New("metrics: no costgate_decision_duration_seconds series")
	}
	return out, nil
}

// runReport prints the medians of each label's runs and the ratios of the
// "costgate" and "leased" labels to the "bare" label.
func runReport(args []string) error {
	if len(args) != 1 {
		return errors.New("usage: proxyload report FILE")
	}
	f, err := os.Open(args[0])
	if err != nil {
		return err
	}
	defer f.Close()
	runs := map[string][]Run{}
	var labels []string
	dec := json.NewDecoder(f)
	for {
		var r Run
		if err := dec.Decode(&r); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return err
		}
		if _, ok := runs[r.Label]; !ok {
			labels = append(labels, r.Label)
		}
		runs[r.Label] = append(runs[r.Label], r)
	}
	med := func(label string, get func(Run) float64) float64 {
		var v []float64
		for _, r := range runs[label] {
			v = append(v, get(r))
		}
		return median(v)
	}
	spread := func(label string, get func(Run) float64) string {
		var v []float64
		for _, r := range runs[label] {
			v = append(v, get(r))
		}
		if len(v) == 0 {
			return ""
		}
		return fmt.Sprintf("%.0f–%.0f", slices.Min(v), slices.Max(v))
	}
	fmt.Println("| proxy | runs | req/s (median) | req/s (min–max) | p50 | p90 | p99 | non-200 | degraded |")
	fmt.Println("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
	for _, l := range labels {
		fmt.Printf("| %s | %d | %.0f | %s | %.0f µs | %.0f µs | %.0f µs | %.0f | %.0f |\n", l, len(runs[l]),
			med(l, func(r Run) float64 { return r.RPS }), spread(l, func(r Run) float64 { return r.RPS }),
			med(l, func(r Run) float64 { return r.P50us }), med(l, func(r Run) float64 { return r.P90us }),
			med(l, func(r Run) float64 { return r.P99us }),
			med(l, func(r Run) float64 { return float64(r.Non200 + r.Errors) }),
			med(l, func(r Run) float64 { return float64(r.Degraded) }))
	}
	fmt.Println()
	var procs []string
	seen := map[string]bool{}
	for _, l := range labels {
		for _, r := range runs[l] {
			for p := range r.CPUus {
				if !seen[p] {
					seen[p] = true
					procs = append(procs, p)
				}
			}
		}
	}
	sort.Strings(procs)
	fmt.Printf("CPU per request (µs, median of runs), by process:\n\n| proxy | %s |\n|---|%s\n", strings.Join(procs, " | "), strings.Repeat("---:|", len(procs)))
	for _, l := range labels {
		fmt.Printf("| %s |", l)
		for _, p := range procs {
			v := med(l, func(r Run) float64 {
				if c, ok := r.CPUus[p]; ok {
					return c
				}
				return -1
			})
			if v < 0 {
				fmt.Print(" – |")
			} else {
				fmt.Printf(" %.1f |", v)
			}
		}
		fmt.Println()
	}
	fmt.Println()
	for _, l := range labels {
		if len(runs[l][0].Stages) == 0 {
			continue
		}
		fmt.Printf("Stage wall time per request, %s (µs, median of runs; sum/count of costgate_decision_duration_seconds):\n\n", l)
		fmt.Println("| stage | mean µs | observations/run |\n| --- | ---: | ---: |")
		for _, s := range []string{"identify", "estimate", "debit", "policy", "ledger", "upstream", "settle", "total", "other"} {
			if _, ok := runs[l][0].Stages[s]; !ok {
				continue
			}
			fmt.Printf("| %s | %.1f | %.0f |\n", s, med(l, func(r Run) float64 { return r.Stages[s] }),
				med(l, func(r Run) float64 { return r.Counts[s] }))
		}
		fmt.Println()
	}
	for _, pair := range [][2]string{{"", "costgate"}, {"-c1", "costgate"}, {"-rate", "costgate"}, {"", "leased"}, {"-c1", "leased"}, {"-rate", "leased"}} {
		suffix, proc := pair[0], pair[1]
		bl, cl := "bare"+suffix, proc+suffix
		if len(runs[bl]) == 0 || len(runs[cl]) == 0 {
			continue
		}
		rps := func(r Run) float64 { return r.RPS }
		p50 := func(r Run) float64 { return r.P50us }
		fmt.Printf("%s / %s: throughput %.2fx, p50 added %.0f µs, CPU per request %.1fx\n", cl, bl,
			med(cl, rps)/med(bl, rps), med(cl, p50)-med(bl, p50),
			med(cl, func(r Run) float64 { return r.CPUus[proc] })/med(bl, func(r Run) float64 { return r.CPUus["bare"] }))
		// Ratios round by round show how noisy the machine was.
		var pr []string
		for _, cr := range runs[cl] {
			for _, br := range runs[bl] {
				if br.Round == cr.Round && br.RPS > 0 {
					pr = append(pr, fmt.Sprintf("%.2f", cr.RPS/br.RPS))
				}
			}
		}
		fmt.Printf("  throughput ratio round by round: %s\n", strings.Join(pr, ", "))
		if suffix == "-rate" {
			var pa []string
			for _, cr := range runs[cl] {
				for _, br := range runs[bl] {
					if br.Round == cr.Round {
						pa = append(pa, fmt.Sprintf("%.0f", cr.P50us-br.P50us))
					}
				}
			}
			fmt.Printf("  p50 added round by round (µs): %s\n", strings.Join(pa, ", "))
		}
	}
	return nil
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
