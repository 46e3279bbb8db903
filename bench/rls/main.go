// Command rlsbench measures rate limit decisions over gRPC on loopback:
// decisions per second, the server's CPU time per decision and the
// latency of each call, for an Envoy RLS v3 server (costgate's RLS
// listener, envoyproxy/ratelimit) and for gubernator v2.13.0's
// GetRateLimits, the baseline. bench/rls.sh runs it; bench/README.md,
// section "RLS decision cost", has the figures.
//
//	rlsbench -target rls -addr 127.0.0.1:8081 -domain costgate -descriptors 1 -pid PID
//	rlsbench -target gubernator -descriptors 3
//
// A decision is one call: one ShouldRateLimit request carrying 1 or 3
// descriptors, or one GetRateLimits call carrying 1 or 3 RateLimitReqs
// (one per descriptor). The descriptors are those of descriptors.go (or
// -entries); a run spreads its calls over -keys distinct key indexes.
//
// -target null without -addr starts, in a child process, an RLS server
// that answers every request OK without deciding anything: what grpc-go
// and the generated protobuf code cost a Go RLS server per call, the floor
// under every figure here.
//
// -target gubernator without -addr starts gubernator in a child process
// (this program again, with -serve-gubernator), a single node that owns
// every key, so that its CPU time is read apart from the load generator's,
// as an external server's is. CPU time is read from /proc before and after
// the measured window: the server's from -pid (the child's for gubernator),
// the store's from -store-pid (Redis, for a server that keeps its state
// there), and this process's own.
//
// Each run prints one line of key=value pairs, or with -json one JSON
// object.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout)
	stop()
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "rlsbench:", err)
		os.Exit(1)
	}
}

// options are the command line's flags.
type options struct {
	target          string
	label           string
	addr            string
	domain          string
	descriptors     int
	entries         string
	keys            int
	hits            int
	limit           int64
	limitDuration   time.Duration
	concurrency     int
	rate            float64
	conns           int
	duration        time.Duration
	warmup          time.Duration
	callTimeout     time.Duration
	pid             int
	storePID        int
	json            bool
	serveGubernator string
	serveNull       string
	freePort        bool

	pattern pattern // from -entries, else the scheme of -descriptors
}

func parseFlags(args []string, out io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet("rlsbench", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.StringVar(&o.target, "target", "rls", "rls (an Envoy RLS v3 server at -addr), gubernator, or null (an RLS server that answers OK and decides nothing: grpc-go's floor)")
	fs.StringVar(&o.label, "label", "", "name of the target in the output (default: -target)")
	fs.StringVar(&o.addr, "addr", "", "server's gRPC address (rls default: 127.0.0.1:8081; gubernator default: start one in a child process)")
	fs.StringVar(&o.domain, "domain", "costgate", "RLS domain of the requests")
	fs.IntVar(&o.descriptors, "descriptors", 1, "descriptors per decision, 1 or 3 (the fixed scheme; see -entries)")
	fs.StringVar(&o.entries, "entries", "", `descriptors as "k=v;k=v|k=v": "|" between descriptors, ";" between entries, {i} the key index, {ip} 10.0.<i/256>.<i%256> (default: the scheme for -descriptors: `+entries1+` or `+entries3+`)`)
	fs.IntVar(&o.keys, "keys", 1000, "distinct key indexes the calls are spread over")
	fs.IntVar(&o.hits, "hits", 1, "hits per descriptor (RLS hits_addend, gubernator hits)")
	fs.Int64Var(&o.limit, "limit", 1_000_000_000, "gubernator: token bucket limit of each descriptor, hits per -limit-duration")
	fs.DurationVar(&o.limitDuration, "limit-duration", time.Minute, "gubernator: the limit's duration")
	fs.IntVar(&o.concurrency, "concurrency", 64, "workers, each with at most one call in flight (one gRPC stream each)")
	fs.Float64Var(&o.rate, "rate", 0, "decisions per second offered, spread over the workers, latency counted from each call's due time (0: closed loop, each worker calls again on its answer)")
	fs.IntVar(&o.conns, "conns", 2, "gRPC connections the workers share (as Envoy opens about one per worker thread)")
	fs.DurationVar(&o.duration, "duration", 10*time.Second, "measured window")
	fs.DurationVar(&o.warmup, "warmup", 2*time.Second, "load before the measured window, not counted")
	fs.DurationVar(&o.callTimeout, "call-timeout", 5*time.Second, "deadline of each call")
	fs.IntVar(&o.pid, "pid", 0, "PID of the server process whose CPU is measured (gubernator child: its own; 0: not measured)")
	fs.IntVar(&o.storePID, "store-pid", 0, "PID of the server's store (redis-server) whose CPU is measured too (0: none)")
	fs.BoolVar(&o.json, "json", false, "print the result as one JSON object")
	fs.StringVar(&o.serveGubernator, "serve-gubernator", "", "serve gubernator's gRPC on this address until stdin ends (the child's role)")
	fs.StringVar(&o.serveNull, "serve-null", "", "serve the null RLS server on this address until stdin ends (the child's role)")
	fs.BoolVar(&o.freePort, "freeport", false, "print a free loopback TCP port and exit")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if o.label == "" {
		o.label = o.target
	}
	if o.hits < 0 || o.hits > 1<<31 {
		return o, fmt.Errorf("-hits %d: out of range", o.hits)
	}
	if o.conns < 1 {
		return o, fmt.Errorf("-conns %d: want at least 1", o.conns)
	}
	if o.keys < 1 || o.keys > 1<<16 {
		return o, fmt.Errorf("-keys %d: want 1 to 65536", o.keys)
	}
	var err error
	if o.entries == "" {
		o.pattern, err = defaultPattern(o.descriptors)
		return o, err
	}
	if o.pattern, err = parsePattern(o.entries); err != nil {
		return o, err
	}
	fs.Visit(func(f *flag.Flag) {
		if f.Name == "descriptors" && o.descriptors != len(o.pattern) {
			err = fmt.Errorf("-entries has %d descriptors, -descriptors says %d", len(o.pattern), o.descriptors)
		}
	})
	return o, err
}

func run(ctx context.Context, args []string, stdout io.Writer) error {
	o, err := parseFlags(args, os.Stderr)
	if err != nil {
		return err
	}
	switch {
	case o.serveGubernator != "":
		return serveGubernator(o.serveGubernator)
	case o.serveNull != "":
		return serveNull(o.serveNull)
	case o.freePort:
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return err
		}
		defer l.Close()
		_, err = fmt.Fprintln(stdout, l.Addr().(*net.TCPAddr).Port)
		return err
	}

	p := o.pattern
	cfg := loadConfig{
		Concurrency: o.concurrency,
		Rate:        o.rate,
		Keys:        o.keys,
		Warmup:      o.warmup,
		Duration:    o.duration,
		CallTimeout: o.callTimeout,
		ServerPID:   o.pid,
		StorePID:    o.storePID,
	}
	addr := o.addr
	switch o.target {
	case "rls":
		if addr == "" {
			addr = "127.0.0.1:8081"
		}
	case "gubernator", "null":
		if addr == "" {
			// The server runs in a child process (this program again),
			// so that its CPU is read apart from the load generator's.
			c, err := spawnChild(o.target, "-serve-"+o.target)
			if err != nil {
				return err
			}
			defer c.close()
			addr = c.addr
			if cfg.ServerPID == 0 {
				cfg.ServerPID = c.pid()
			}
		}
	default:
		return fmt.Errorf("-target %q: want rls, gubernator or null", o.target)
	}

	conns := make([]*grpc.ClientConn, o.conns)
	for i := range conns {
		conns[i], err = grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return fmt.Errorf("dial %s: %w", addr, err)
		}
		defer conns[i].Close()
	}
	var c caller
	if o.target != "gubernator" {
		c = newRLSCaller(conns, o.domain, p, o.keys, uint32(o.hits))
	} else {
		c = newGuberCaller(conns, p, o.keys, int64(o.hits), o.limit, o.limitDuration)
	}
	res, err := drive(ctx, cfg, c)
	if err != nil {
		return fmt.Errorf("%s at %s: %w", o.label, addr, err)
	}
	res.Target = o.label
	res.Descriptors = len(p)
	res.Conns = o.conns
	return printResult(stdout, res, o.json)
}

// printResult writes res as one line: key=value pairs, or a JSON object.
func printResult(w io.Writer, res Result, asJSON bool) error {
	if asJSON {
		return json.NewEncoder(w).Encode(res)
	}
	f := func(v float64, prec int) string { return strconv.FormatFloat(v, 'f', prec, 64) }
	opt := func(v *float64) string {
		if v == nil {
			return "-"
		}
		return f(*v, 2)
	}
	rate := "closed"
	if res.Rate > 0 {
		rate = f(res.Rate, 0)
	}
	fields := []string{
		"target=" + res.Target,
		"descriptors=" + strconv.Itoa(res.Descriptors),
		"conc=" + strconv.Itoa(res.Concurrency),
		"rate=" + rate,
		"conns=" + strconv.Itoa(res.Conns),
		"keys=" + strconv.Itoa(res.Keys),
		"decisions=" + strconv.FormatUint(res.Decisions, 10),
		"decisions/s=" + f(res.PerSecond, 0),
		"cpu_us/decision=" + opt(res.ServerCPU),
		"cpu_stat_us/decision=" + opt(res.ServerCPUStat),
		"store_cpu_us/decision=" + opt(res.StoreCPU),
		"client_cpu_us/decision=" + f(res.ClientCPU, 2),
		"p50_ms=" + f(res.P50, 3),
		"p90_ms=" + f(res.P90, 3),
		"p99_ms=" + f(res.P99, 3),
		"max_ms=" + f(res.Max, 3),
		"over_limit=" + strconv.FormatUint(res.OverLimit, 10),
		"errors=" + strconv.FormatUint(res.Errors, 10),
		"load1=" + res.Load1,
	}
	if res.FirstError != "" {
		fields = append(fields, "first_error="+strconv.Quote(res.FirstError))
	}
	_, err := fmt.Fprintln(w, strings.Join(fields, " "))
	return err
}
