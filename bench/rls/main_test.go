package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// okServer is the smallest Envoy RLS v3 server: it allows every request
// and keeps the first request of each domain it sees.
type okServer struct {
	rlsv3.UnimplementedRateLimitServiceServer

	mu    sync.Mutex
	first map[string]*rlsv3.RateLimitRequest
	calls int
}

func (s *okServer) ShouldRateLimit(_ context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	s.mu.Lock()
	s.calls++
	if s.first[req.GetDomain()] == nil {
		s.first[req.GetDomain()] = req
	}
	s.mu.Unlock()
	return &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK}, nil
}

// startOKServer serves an okServer on a free loopback port until the test
// ends and returns it with its address.
func startOKServer(t *testing.T) (*okServer, string) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	s := &okServer{first: map[string]*rlsv3.RateLimitRequest{}}
	rlsv3.RegisterRateLimitServiceServer(srv, s)
	go srv.Serve(l)
	t.Cleanup(srv.Stop)
	return s, l.Addr().String()
}

// descriptorStrings writes a request's descriptors as -entries does.
func descriptorStrings(req *rlsv3.RateLimitRequest) string {
	var ds []string
	for _, d := range req.GetDescriptors() {
		var es []string
		for _, e := range d.GetEntries() {
			es = append(es, e.GetKey()+"="+e.GetValue())
		}
		ds = append(ds, strings.Join(es, ";"))
	}
	return strings.Join(ds, "|")
}

// TestRunRLS drives a test RLS server for 1 s with each fixed scheme and
// checks the output line's fields and the descriptors the server got.
func TestRunRLS(t *testing.T) {
	srv, addr := startOKServer(t)
	pid := strconv.Itoa(os.Getpid())
	tests := []struct {
		name        string
		domain      string
		descriptors string
		wantFirst   string // descriptors of the first call, key index 0
	}{
		{"one descriptor", "one", "1", "tenant=bench-0"},
		{"three descriptors", "three", "3", "tenant=bench-0|tenant=bench-0;generic_key=search|remote_address=10.0.0.0"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			args := []string{"-target", "rls", "-addr", addr, "-domain", tc.domain, "-descriptors", tc.descriptors,
				"-concurrency", "8", "-keys", "50", "-warmup", "200ms", "-duration", "1s", "-pid", pid}
			if err := run(t.Context(), args, &out); err != nil {
				t.Fatal(err)
			}
			line := out.String()
			fields := map[string]string{}
			for f := range strings.FieldsSeq(line) {
				k, v, _ := strings.Cut(f, "=")
				fields[k] = v
			}
			for _, k := range []string{"target", "descriptors", "conc", "decisions", "decisions/s", "cpu_us/decision",
				"client_cpu_us/decision", "p50_ms", "p90_ms", "p99_ms", "max_ms", "errors"} {
				if _, ok := fields[k]; !ok {
					t.Errorf("no %s in %q", k, line)
				}
			}
			if fields["target"] != "rls" || fields["descriptors"] != tc.descriptors || fields["errors"] != "0" {
				t.Errorf("target, descriptors, errors: got %q", line)
			}
			if n, _ := strconv.Atoi(fields["decisions"]); n <= 0 {
				t.Errorf("decisions %q, want > 0", fields["decisions"])
			}
			if cpu, _ := strconv.ParseFloat(fields["cpu_us/decision"], 64); cpu <= 0 {
				t.Errorf("cpu_us/decision %q, want > 0", fields["cpu_us/decision"])
			}
			srv.mu.Lock()
			first := srv.first[tc.domain]
			srv.mu.Unlock()
			if got := descriptorStrings(first); got != tc.wantFirst {
				t.Errorf("first request's descriptors: got %q, want %q", got, tc.wantFirst)
			}
			if first.GetHitsAddend() != 1 {
				t.Errorf("hits_addend %d, want 1", first.GetHitsAddend())
			}
		})
	}
}

// TestRunJSON checks the -json output and the -entries flag.
func TestRunJSON(t *testing.T) {
	srv, addr := startOKServer(t)
	var out bytes.Buffer
	args := []string{"-addr", addr, "-domain", "json", "-entries", "tenant=bench-free;generic_key=search",
		"-concurrency", "2", "-warmup", "0s", "-duration", "300ms", "-json"}
	if err := run(t.Context(), args, &out); err != nil {
		t.Fatal(err)
	}
	var res Result
	if err := json.Unmarshal(out.Bytes(), &res); err != nil {
		t.Fatalf("%v: %q", err, out.String())
	}
	if res.Decisions == 0 || res.Descriptors != 1 || res.ServerCPU != nil {
		t.Errorf("got %+v, want decisions, 1 descriptor and no server CPU (no -pid)", res)
	}
	srv.mu.Lock()
	got := descriptorStrings(srv.first["json"])
	srv.mu.Unlock()
	if got != "tenant=bench-free;generic_key=search" {
		t.Errorf("descriptors %q", got)
	}
}

// TestRunRate checks that -rate offers about the rate asked for.
func TestRunRate(t *testing.T) {
	_, addr := startOKServer(t)
	var out bytes.Buffer
	args := []string{"-addr", addr, "-rate", "400", "-concurrency", "8", "-warmup", "200ms", "-duration", "1s", "-json"}
	if err := run(t.Context(), args, &out); err != nil {
		t.Fatal(err)
	}
	var res Result
	if err := json.Unmarshal(out.Bytes(), &res); err != nil {
		t.Fatalf("%v: %q", err, out.String())
	}
	if res.Rate != 400 || res.PerSecond < 300 || res.PerSecond > 440 {
		t.Errorf("rate %v, decisions/s %v: want about 400", res.Rate, res.PerSecond)
	}
}

// TestUnreachable checks that a server that is not there is one clear
// error, not a run of failed calls.
func TestUnreachable(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	err = run(t.Context(), []string{"-addr", addr, "-duration", "100ms", "-warmup", "0s"}, &bytes.Buffer{})
	if err == nil || !strings.Contains(err.Error(), "first call") {
		t.Fatalf("got %v, want an error of the first call", err)
	}
}

// TestGubernator drives an in-process gubernator node with the 3-descriptor
// scheme: every item must be decided locally, without an error.
func TestGubernator(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	d, addr, err := startGubernator(ctx, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	p, err := defaultPattern(3)
	if err != nil {
		t.Fatal(err)
	}
	c := newGuberCaller([]*grpc.ClientConn{conn}, p, 20, 1, 1_000_000_000, time.Minute)
	res, err := drive(ctx, loadConfig{Concurrency: 4, Keys: 20, Duration: 500 * time.Millisecond, CallTimeout: 5 * time.Second}, c)
	if err != nil {
		t.Fatal(err)
	}
	if res.Decisions == 0 || res.Errors != 0 || res.OverLimit != 0 {
		t.Fatalf("got %+v, want decisions, no error, nothing over the limit", res)
	}
	if got := c.reqs[1].Requests[1]; got.Name != "tenant.generic_key" || got.UniqueKey != "bench-1|search" {
		t.Errorf("second item of key 1: %s %s", got.Name, got.UniqueKey)
	}

	// A limit of 1 refuses the second call on a key: a refusal, not an error.
	c = newGuberCaller([]*grpc.ClientConn{conn}, p, 1, 1, 1, time.Hour)
	res, err = drive(ctx, loadConfig{Concurrency: 1, Keys: 1, Duration: 200 * time.Millisecond}, c)
	if err != nil {
		t.Fatal(err)
	}
	if res.Errors != 0 || res.OverLimit == 0 || res.OverLimit != res.Decisions {
		t.Fatalf("got %+v, want every decision over the limit", res)
	}
}

func TestHistogram(t *testing.T) {
	tests := []struct {
		name   string
		values []time.Duration
		q      float64
		want   time.Duration
	}{
		{"empty", nil, 0.5, 0},
		{"one value", []time.Duration{time.Millisecond}, 0.99, time.Millisecond},
		{"small exact", []time.Duration{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, 0.5, 5},
		{"p99 of 100", func() []time.Duration {
			var v []time.Duration
			for i := 1; i <= 100; i++ {
				v = append(v, time.Duration(i)*time.Millisecond)
			}
			return v
		}(), 0.99, 99 * time.Millisecond},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var h histogram
			for _, v := range tc.values {
				h.record(v)
			}
			got := h.quantile(tc.q)
			// A bucket's upper bound is within 1/16 above its values.
			if got < tc.want || float64(got) > float64(tc.want)*(1+1.0/16) {
				t.Errorf("quantile(%v) = %v, want %v to +6.25%%", tc.q, got, tc.want)
			}
		})
	}
	for _, d := range []time.Duration{0, 1, 15, 16, 17, 31, 32, 1000, 123456789, time.Hour} {
		i := histIndex(d)
		if d > histUpper(i) || (i > 0 && d <= histUpper(i-1)) {
			t.Errorf("%v in bucket %d, whose range is (%v, %v]", d, i, histUpper(i-1), histUpper(i))
		}
	}
}

func TestParsePattern(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		wantErr bool
	}{
		{"one entry", "tenant=bench-{i}", false},
		{"two descriptors", "tenant=a;generic_key=search|remote_address={ip}", false},
		{"no value", "tenant=", true},
		{"no key", "=x", true},
		{"no equals", "tenant", true},
		{"empty descriptor", "a=b||c=d", true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, err := parsePattern(tc.in)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err %v, want error %v", err, tc.wantErr)
			}
			if err == nil && p.String() != tc.in {
				t.Errorf("String() = %q, want %q", p.String(), tc.in)
			}
		})
	}
	p, _ := parsePattern(entries3)
	if got := p.expand(2, 258); got[0].value != "10.0.1.2" {
		t.Errorf("{ip} of 258: %q", got[0].value)
	}
}

// slowCaller answers at once, except worker 0's first call at or after
// from, which takes stall.
type slowCaller struct {
	mu      sync.Mutex
	from    time.Time
	stall   time.Duration
	stalled bool
}

func (c *slowCaller) call(ctx context.Context, worker, _ int) (bool, error) {
	c.mu.Lock()
	stall := worker == 0 && c.stall > 0 && !c.stalled && !time.Now().Before(c.from)
	c.stalled = c.stalled || stall
	c.mu.Unlock()
	if stall {
		select {
		case <-time.After(c.stall):
		case <-ctx.Done():
		}
	}
	return false, nil
}

// TestDriveChargesTheServersBacklog: with a rate, a call made late
// because the worker's last call was slow counts from when it was due: a
// worker stalled 300 ms in the measured window, with calls due every
// 10 ms, has the calls due meanwhile measured at up to about 300 ms; and
// a server that answers at once is not charged its caller's timer.
func TestDriveChargesTheServersBacklog(t *testing.T) {
	// 64 workers at 2,000/s: charged their timers' late wake-ups, an
	// instant server measured p50 0.56 ms and p99 1.1 ms.
	fast, err := drive(t.Context(), loadConfig{Concurrency: 64, Rate: 2000, Keys: 1, Warmup: 100 * time.Millisecond, Duration: time.Second}, &slowCaller{})
	if err != nil {
		t.Fatal(err)
	}
	if fast.P99 > 0.5 {
		t.Errorf("an instant server: p99 %.3f ms; want its caller's timer not counted", fast.P99)
	}
	cfg := loadConfig{Concurrency: 2, Rate: 200, Keys: 1, Warmup: 100 * time.Millisecond, Duration: time.Second}
	slow, err := drive(t.Context(), cfg, &slowCaller{from: time.Now().Add(cfg.Warmup + 300*time.Millisecond), stall: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if slow.Max < 250 || slow.P90 < 50 {
		t.Errorf("a worker stalled 300 ms: p90 %.3f ms, max %.3f ms; want its backlog charged", slow.P90, slow.Max)
	}
}

// TestNull runs -target null: the harness starts the null RLS server in a
// child process (a test binary cannot, so it is built first), and every
// call is answered OK with the child's CPU measured.
func TestNull(t *testing.T) {
	exe := filepath.Join(t.TempDir(), "rlsbench")
	if out, err := exec.Command("go", "build", "-o", exe, ".").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	out, err := exec.Command(exe, "-target", "null", "-descriptors", "3", "-concurrency", "4", "-duration", "300ms", "-warmup", "0s", "-json").Output()
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	var res Result
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if res.Target != "null" || res.Decisions == 0 || res.Errors != 0 || res.OverLimit != 0 || res.ServerCPU == nil {
		t.Fatalf("got %s, want decisions, no error, nothing over the limit, the child's CPU", out)
	}
}
