package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/ledger"
	"github.com/costgate/costgate/policies"
	"github.com/costgate/costgate/proxy"
	"github.com/costgate/costgate/replay"
	"github.com/costgate/costgate/simulator"
)

// Set by the build: go build -ldflags "-X main.buildVersion=v1.2.3 -X main.buildCommit=abc".
var (
	buildVersion = "dev"
	buildCommit  = ""
)

func version(w io.Writer) error {
	commit := buildCommit
	if info, ok := debug.ReadBuildInfo(); ok && commit == "" {
		for _, s := range info.Settings {
			if s.Key == "vcs.revision" {
				commit = s.Value
			}
		}
	}
	if commit == "" {
		commit = "unknown"
	}
	_, err := fmt.Fprintf(w, "costgate %s commit %s %s\n", buildVersion, commit, runtime.Version())
	return err
}

func simulate(ctx context.Context, args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("simulate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	listen := fs.String("listen", "127.0.0.1:8081", "address to serve on")
	latency := fs.Duration("latency", 0, "delay before each answer's first byte")
	interval := fs.Duration("token-interval", 0, "pause between streamed tokens")
	errRate := fs.Float64("error-rate", 0, "fraction of requests answered 500, 0 to 1")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *errRate < 0 || *errRate > 1 {
		return fmt.Errorf("--error-rate must be between 0 and 1, not %v", *errRate)
	}
	est, err := costmodel.NewEstimator(costmodel.Config{})
	if err != nil {
		return err
	}
	srv := &http.Server{
		Addr:              *listen,
		Handler:           simulator.New(simulator.Config{Estimator: est, Latency: *latency, TokenInterval: *interval, ErrorRate: *errRate}),
		ReadHeaderTimeout: 10 * time.Second,
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.ListenAndServe() }()
	slog.New(slog.NewJSONHandler(stderr, nil)).Info("simulator listening", "addr", *listen)
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return srv.Shutdown(shutdown)
}

// estimate prints what costgate would reserve for one request, priced under
// the config as serve would price it, and why.
func estimate(args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("estimate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cf configFlags
	cf.register(fs)
	route := fs.String("route", "/v1/chat/completions", "API path of the request (/v1/chat/completions, /v1/messages, ...), a generic upstream's /u/NAME/PATH[?QUERY], or a kind (chat_completions, completions, embeddings, responses, anthropic_messages)")
	model := fs.String("model", "", "model, overriding the body's")
	method := fs.String("method", "POST", "HTTP method of a generic route's request")
	tenant := fs.String("tenant", "", "tenant whose learned output estimate applies (output_reserve: pNN)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	body, err := io.ReadAll(io.LimitReader(stdin, 64<<20))
	if err != nil {
		return fmt.Errorf("read body: %w", err)
	}
	if *model != "" {
		var m map[string]json.RawMessage
		if err := json.Unmarshal(body, &m); err != nil {
			return fmt.Errorf("body is not a JSON object: %w", err)
		}
		m["model"], _ = json.Marshal(*model)
		body, _ = json.Marshal(m)
	}
	cfg, _, err := cf.load()
	if err != nil {
		return err
	}
	header := http.Header{}
	if len(body) > 0 {
		header.Set("Content-Type", "application/json")
	}
	q, err := proxy.QuoteRequest(cfg, strings.ToUpper(*method), *route, header, body)
	if err != nil {
		return err
	}
	// The estimate's own fields, then what is reserved and why.
	b, err := json.Marshal(q.Estimate)
	if err != nil {
		return err
	}
	var out map[string]any
	if err := json.Unmarshal(b, &out); err != nil {
		return err
	}
	out["why"] = q.Why
	out["route"] = q.Route
	if q.Upstream != "" {
		out["upstream"] = q.Upstream
	} else {
		out["reserved_output_tokens"] = q.Estimate.Usage.OutputTokens
	}
	if *tenant != "" {
		if err := learnedQuote(cfg, *tenant, q, out, stderr); err != nil {
			return err
		}
	}
	out["why"] = out["why"].([]string)
	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(out)
}

const policyUsage = "usage: costgate policy check DIR | costgate policy test DIR | costgate policy replay --policies DIR [--since 24h] [--tenant T] [--format text|json] [--capture DIR] [--config FILE] | costgate policy list | costgate policy promote ID [--replay ID --ack SHA256] | costgate policy demote ID"

func policy(ctx context.Context, args []string, stdout io.Writer) error {
	if len(args) > 0 && args[0] == "replay" {
		return policyReplay(ctx, args[1:], stdout)
	}
	if len(args) > 0 && (args[0] == "promote" || args[0] == "demote" || args[0] == "list") {
		return policyPromote(ctx, args[0], args[1:], stdout)
	}
	if len(args) != 2 || (args[0] != "check" && args[0] != "test") {
		return errors.New(policyUsage)
	}
	dir := args[1]
	if st, err := os.Stat(dir); err != nil || !st.IsDir() {
		return fmt.Errorf("policy directory %q: not a directory", dir)
	}
	fsys := os.DirFS(dir)
	if args[0] == "check" {
		if err := policies.Check(fsys); err != nil {
			return err
		}
		_, err := fmt.Fprintf(stdout, "policies in %s compile\n", dir)
		return err
	}
	passed, failed, err := policies.Test(ctx, fsys, stdout)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%d passed, %d failed\n", passed, failed)
	if failed > 0 {
		return fmt.Errorf("%d policy tests failed", failed)
	}
	return nil
}

const ledgerUsage = `usage: costgate ledger export --tenant T --from WHEN --to WHEN [--format csv|json|cloudevents]
         WHEN is a date, YYYY-MM-DD, a whole day in UTC with both --from's and
         --to's days included (--from 2026-03-01 --to 2026-03-01 is that day),
         or an RFC 3339 time, exact (--from included, --to excluded)
       costgate ledger nodes
       costgate ledger recover --node ID --before TIME`

func ledgerCmd(ctx context.Context, args []string, stdout io.Writer) error {
	if len(args) == 0 {
		return errors.New(ledgerUsage)
	}
	switch args[0] {
	case "export":
		return ledgerExport(ctx, args[1:], stdout)
	case "nodes":
		return ledgerNodes(ctx, args[1:], stdout)
	case "recover":
		return ledgerRecover(ctx, args[1:], stdout)
	}
	return errors.New(ledgerUsage)
}

func ledgerExport(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("ledger export", flag.ContinueOnError)
	var cf configFlags
	cf.register(fs)
	tenant := fs.String("tenant", "", "tenant to export (required)")
	from := fs.String("from", "", "start: a date YYYY-MM-DD (its whole UTC day is included) or an RFC 3339 time (included) (required)")
	to := fs.String("to", "", "end: a date YYYY-MM-DD (its whole UTC day is included) or an RFC 3339 time (excluded) (required)")
	format := fs.String("format", "csv", "csv, json or cloudevents")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *tenant == "" || *from == "" || *to == "" {
		return errors.New("ledger export: --tenant, --from and --to are required")
	}
	f, t, err := ledger.ParseRange(*from, *to)
	if err != nil {
		return fmt.Errorf("ledger export: --from %q, --to %q: %w", *from, *to, err)
	}
	cfg, _, err := cf.load()
	if err != nil {
		return err
	}
	dir := cfg.DataDirPath()
	// Read-only, so that it works beside a running serve on the same
	// data directory.
	l, err := ledger.Open(ctx, ledger.Config{DSN: cfg.Ledger.DSN, Dir: dir, ReadOnly: true})
	if err != nil {
		return err
	}
	defer l.Close()
	return l.Export(ctx, stdout, ledger.Query{Tenant: *tenant, From: f, To: t}, strings.ToLower(*format))
}

// ledgerNodes prints the nodes known to the ledger's store with the
// reservations each holds open. It opens the store read-only, so that it
// works beside a running serve.
func ledgerNodes(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("ledger nodes", flag.ContinueOnError)
	var cf configFlags
	cf.register(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("ledger nodes: unexpected argument %q", fs.Arg(0))
	}
	cfg, _, err := cf.load()
	if err != nil {
		return err
	}
	l, err := ledger.Open(ctx, ledger.Config{DSN: cfg.Ledger.DSN, Dir: cfg.DataDirPath(), ReadOnly: true})
	if err != nil {
		return err
	}
	defer l.Close()
	nodes, err := l.Nodes(ctx)
	if err != nil {
		return err
	}
	own := ""
	if b, err := os.ReadFile(filepath.Join(cfg.DataDirPath(), "node")); err == nil {
		own = strings.TrimSpace(string(b))
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tOPEN\tOLDEST")
	for _, n := range nodes {
		oldest := "-"
		if !n.Oldest.IsZero() {
			oldest = n.Oldest.UTC().Format(time.RFC3339)
		}
		id := n.Node
		if id == own {
			id += " (this data dir)"
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\n", id, n.Open, oldest)
	}
	return tw.Flush()
}

// ledgerRecover finalizes at their estimate the reservations that a node
// whose data directory is lost for good left open.
func ledgerRecover(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("ledger recover", flag.ContinueOnError)
	var cf configFlags
	cf.register(fs)
	node := fs.String("node", "", "id of the lost node, as ledger nodes lists it (required)")
	before := fs.String("before", "", "recover only reservations created before this, YYYY-MM-DD or RFC 3339 (required): no request of the node may still be in flight before it")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *node == "" || *before == "" {
		return errors.New("ledger recover: --node and --before are required")
	}
	b, err := parseWhen(*before)
	if err != nil {
		return fmt.Errorf("--before: %w", err)
	}
	cfg, _, err := cf.load()
	if err != nil {
		return err
	}
	l, err := ledger.Open(ctx, ledger.Config{DSN: cfg.Ledger.DSN, Dir: cfg.DataDirPath(), Admin: true})
	if err != nil {
		return err
	}
	defer l.Close()
	n, err := l.RecoverNode(ctx, *node, b)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(stdout, "recovered %d reservations of node %s created before %s at their estimate\n", n, *node, b.UTC().Format(time.RFC3339))
	return err
}

func parseWhen(s string) (time.Time, error) {
	if t, err := time.Parse(time.DateOnly, s); err == nil {
		return t, nil
	}
	return time.Parse(time.RFC3339, s)
}

// policyReplay evaluates a candidate policy directory against the
// captured requests and prints what would change (see package replay).
func policyReplay(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("policy replay", flag.ContinueOnError)
	var cf configFlags
	cf.register(fs)
	dir := fs.String("policies", "", "candidate policy directory (required)")
	since := fs.Duration("since", 0, "replay the requests of this last period only, e.g. 24h (default: all captured)")
	tenant := fs.String("tenant", "", "replay one tenant's requests only")
	format := fs.String("format", "text", "text or json")
	capture := fs.String("capture", "", "capture directory (default: the config's capture.dir, else data_dir/capture)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *dir == "" {
		return errors.New("policy replay: --policies is required")
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("policy replay: unexpected argument %q", fs.Arg(0))
	}
	if *format != "text" && *format != "json" {
		return fmt.Errorf("policy replay: --format must be text or json, not %q", *format)
	}
	if st, err := os.Stat(*dir); err != nil || !st.IsDir() {
		return fmt.Errorf("policy directory %q: not a directory", *dir)
	}
	capDir := *capture
	if capDir == "" {
		cfg, _, err := cf.load()
		if err != nil {
			return err
		}
		capDir = cfg.CaptureDir()
	}
	rep, err := replay.Run(ctx, os.DirFS(*dir), capDir, replay.Options{Since: *since, Tenant: *tenant})
	if err != nil {
		return err
	}
	if *format == "json" {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	return rep.WriteText(stdout)
}
