package replay

import (
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"reflect"
	"runtime"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/policies"
)

// Options narrow a replay to some of the captured requests.
type Options struct {
	// Since keeps the requests that arrived within Since before Now (by
	// input.time.unix); 0 keeps all.
	Since time.Duration
	// Tenant keeps one tenant's requests; empty keeps all.
	Tenant string
	// Now is the end of the Since window; zero means time.Now().
	Now time.Time
	// Workers is how many goroutines evaluate the inputs; 0 means
	// GOMAXPROCS. The report does not depend on it.
	Workers int
}

// Report is what a candidate policy set would have changed on the captured
// requests. A change is a request whose enforced decision (outcome,
// status, deciding policy or friction) differs from the one taken.
type Report struct {
	Files     int `json:"files"`     // capture files read
	Records   int `json:"records"`   // records read
	Replayed  int `json:"replayed"`  // records that passed the filters and were evaluated
	Truncated int `json:"truncated"` // last lines cut short (a stop while writing), skipped
	Changed   int `json:"changed"`
	// ChangedCost is the estimated cost of the changed requests.
	ChangedCost costmodel.NanoUSD `json:"changed_cost_nano_usd"`
	// Transitions counts changes by old and new outcome, most frequent
	// first. From equals To when the outcome stays and its status, policy
	// or friction changes.
	Transitions []Transition `json:"transitions"`
	// Policies counts changes by policy: the new deciding policy, or the
	// old one when the new decision is an allow. Most changes first.
	Policies []PolicyChanges `json:"policies"`
	// Tenants are the 10 tenants with the most changed requests.
	Tenants []TenantChanges `json:"tenants"`
}

// Transition is one kind of change.
type Transition struct {
	From  policies.Outcome  `json:"from"`
	To    policies.Outcome  `json:"to"`
	Count int               `json:"count"`
	Cost  costmodel.NanoUSD `json:"cost_nano_usd"`
	// Samples are up to 3 of the changed requests, the first captured.
	Samples []Sample `json:"samples"`
}

// Name is "from->to", e.g. "allow->soft".
func (t *Transition) Name() string { return string(t.From) + "->" + string(t.To) }

// Sample is one changed request.
type Sample struct {
	RequestID string          `json:"request_id"`
	Old       Taken           `json:"old"`
	New       Taken           `json:"new"`
	Input     *policies.Input `json:"input"`
}

// PolicyChanges are the changes one policy makes.
type PolicyChanges struct {
	Policy string            `json:"policy"`
	Count  int               `json:"count"`
	Cost   costmodel.NanoUSD `json:"cost_nano_usd"`
	// Transitions counts its changes by Transition.Name.
	Transitions map[string]int `json:"transitions"`
}

// TenantChanges are the changes to one tenant's requests.
type TenantChanges struct {
	Tenant string            `json:"tenant"`
	Count  int               `json:"count"`
	Cost   costmodel.NanoUSD `json:"cost_nano_usd"`
}

// DisagreeError is returned when the fast path and OPA's evaluator decide
// a captured input differently: a bug of the fast path, found on real
// traffic.
type DisagreeError struct {
	File      string
	Line      int
	RequestID string
	Input     *policies.Input
	Fast      string // the fast path's decision or error
	Rego      string // OPA's decision or error
}

func (e *DisagreeError) Error() string {
	in, _ := json.Marshal(e.Input)
	return fmt.Sprintf("replay: %s:%d: request %s: the fast path decides %s, OPA's evaluator %s; input: %s",
		e.File, e.Line, e.RequestID, e.Fast, e.Rego, in)
}

// EvalError is returned when the candidate policies fail to evaluate a
// captured input: published, they would fail on that request.
type EvalError struct {
	File      string
	Line      int
	RequestID string
	Err       error
}

func (e *EvalError) Error() string {
	return fmt.Sprintf("replay: %s:%d: request %s: %v", e.File, e.Line, e.RequestID, e.Err)
}

func (e *EvalError) Unwrap() error { return e.Err }

// Run loads the candidate policy directory policiesFS (see policies.Load),
// evaluates it on every record of the capture files of captureDir, oldest
// first, that opts keep, and reports what changes. Each input is decided
// on the fast path and on OPA's evaluator alone; a disagreement is a
// *DisagreeError, an evaluation error an *EvalError, and both stop the
// replay. The capture files are read as they are: Run may run beside a
// costgate that writes them.
//
// Before it evaluates anything, Run refuses (a *MissingFieldError) a
// candidate that reads an input field a capture file's records lack (a
// capture written by an older costgate, before the field existed): its
// decisions would be made on a zero value. It checks the fields of
// objects (input.caller.plan), not those of list elements.
func Run(ctx context.Context, policiesFS fs.FS, captureDir string, opts Options) (*Report, error) {
	set, err := policies.Load(policiesFS)
	if err != nil {
		return nil, err
	}
	return RunSet(ctx, set, captureDir, opts)
}

// RunSet is Run with a loaded set: the active set of a running costgate,
// or one with a policy promoted (policies.Set.Promote).
func RunSet(ctx context.Context, set *policies.Set, captureDir string, opts Options) (*Report, error) {
	files, err := Files(captureDir)
	if err != nil {
		return nil, err
	}
	if err := checkFields(set, files); err != nil {
		return nil, err
	}
	rp := newReplayer(set, opts)
	workers := opts.Workers
	if workers <= 0 {
		workers = runtime.GOMAXPROCS(0)
	}
	batch := make([]item, 0, batchSize)
	for _, f := range files {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		st, err := ReadFile(f, func(rec *Record, line int) error {
			if !rp.keep(rec) {
				return nil
			}
			batch = append(batch, item{rec: rec, file: f, line: line})
			if len(batch) < batchSize {
				return nil
			}
			err := rp.run(ctx, batch, workers)
			batch = batch[:0]
			return err
		})
		rp.report.Files++
		rp.report.Records += st.Records
		rp.report.Truncated += st.Truncated
		if err != nil {
			return nil, err
		}
	}
	if err := rp.run(ctx, batch, workers); err != nil {
		return nil, err
	}
	return rp.finish(), nil
}

// batchSize is how many records are evaluated in parallel, then accounted
// in order.
const batchSize = 1024

// run evaluates batch on workers goroutines, then accounts it in capture
// order: the error returned is the first record's to fail.
func (rp *replayer) run(ctx context.Context, batch []item, workers int) error {
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(workers, len(batch)) {
		wg.Go(func() {
			for i := next.Add(1) - 1; i < int64(len(batch)); i = next.Add(1) - 1 {
				rp.eval(ctx, &batch[i])
			}
		})
	}
	wg.Wait()
	for i := range batch {
		if err := rp.account(&batch[i]); err != nil {
			return err
		}
	}
	return nil
}

// MissingFieldError is returned by Run for a candidate policy set that
// reads an input field the records of a capture file lack.
type MissingFieldError struct {
	Field string // e.g. "caller.region"
	File  string
}

func (e *MissingFieldError) Error() string {
	return fmt.Sprintf("replay: the candidate policies read input.%s, which the records of %s lack; they would decide on a zero value", e.Field, e.File)
}

// checkFields refuses a set that reads a field the files lack.
func checkFields(set *policies.Set, files []string) error {
	paths := set.InputPaths()
	for _, f := range files {
		have, err := Fields(f)
		if err != nil {
			return err
		}
		if have == nil {
			continue
		}
		for _, p := range paths {
			if p == "" {
				continue
			}
			// Only object fields are listed; request.attributes.NAME is a
			// key of a map, present or not per request.
			parts := strings.SplitN(p, ".", 3)
			field := strings.Join(parts[:min(2, len(parts))], ".")
			if !have[field] {
				return &MissingFieldError{Field: field, File: f}
			}
		}
	}
	return nil
}

// replayer accumulates a Report.
type replayer struct {
	set     *policies.Set
	tenant  string
	since   int64 // Unix seconds; records before it are skipped; 0 keeps all
	noRego  bool  // skip the differential (benchmarks of the fast path)
	report  Report
	trans   map[[2]policies.Outcome]*Transition
	pols    map[string]*PolicyChanges
	tenants map[string]*TenantChanges
}

func newReplayer(set *policies.Set, opts Options) *replayer {
	rp := &replayer{set: set, tenant: opts.Tenant,
		trans: map[[2]policies.Outcome]*Transition{}, pols: map[string]*PolicyChanges{}, tenants: map[string]*TenantChanges{}}
	if opts.Since > 0 {
		now := opts.Now
		if now.IsZero() {
			now = time.Now()
		}
		rp.since = now.Add(-opts.Since).Unix()
	}
	return rp
}

// samplesPerKind bounds Transition.Samples.
const samplesPerKind = 3

// topTenants bounds Report.Tenants.
const topTenants = 10

// item is one record on its way through a replay.
type item struct {
	rec  *Record
	file string
	line int
	d    policies.Decision
	err  error // a *DisagreeError or an *EvalError
}

// keep reports whether the filters keep rec.
func (rp *replayer) keep(rec *Record) bool {
	in := rec.Input
	return (rp.tenant == "" || in.Caller.Tenant == rp.tenant) && in.Time.Unix >= rp.since
}

// eval decides it.rec on the fast path and, unless noRego, on OPA's
// evaluator. It is safe for concurrent use.
func (rp *replayer) eval(ctx context.Context, it *item) {
	rec := it.rec
	d, err := rp.set.Decide(ctx, rec.Input)
	if !rp.noRego {
		ref, refErr := rp.set.DecideRego(ctx, rec.Input)
		if fmt.Sprint(err) != fmt.Sprint(refErr) || !reflect.DeepEqual(d, ref) {
			it.err = &DisagreeError{File: it.file, Line: it.line, RequestID: rec.RequestID, Input: rec.Input,
				Fast: outcomeOf(d, err), Rego: outcomeOf(ref, refErr)}
			return
		}
	}
	if err != nil {
		it.err = &EvalError{File: it.file, Line: it.line, RequestID: rec.RequestID, Err: err}
		return
	}
	it.d = d
}

// add evaluates and accounts one record, on the calling goroutine.
func (rp *replayer) add(ctx context.Context, rec *Record, file string, line int) error {
	if !rp.keep(rec) {
		return nil
	}
	it := item{rec: rec, file: file, line: line}
	rp.eval(ctx, &it)
	return rp.account(&it)
}

// account adds an evaluated record to the report. Records are accounted
// in capture order.
func (rp *replayer) account(it *item) error {
	if it.err != nil {
		return it.err
	}
	rp.report.Replayed++
	rec, in, d := it.rec, it.rec.Input, &it.d
	now := TakenOf(d)
	old := rec.Decision
	if now == old {
		return nil
	}
	rp.report.Changed++
	rp.report.ChangedCost += rec.Cost
	key := [2]policies.Outcome{old.Outcome, now.Outcome}
	t := rp.trans[key]
	if t == nil {
		t = &Transition{From: old.Outcome, To: now.Outcome}
		rp.trans[key] = t
	}
	t.Count++
	t.Cost += rec.Cost
	if len(t.Samples) < samplesPerKind {
		t.Samples = append(t.Samples, Sample{RequestID: rec.RequestID, Old: old, New: now, Input: in})
	}
	pol := now.Policy
	if now.Outcome == policies.Allow || pol == "" {
		pol = old.Policy
	}
	p := rp.pols[pol]
	if p == nil {
		p = &PolicyChanges{Policy: pol, Transitions: map[string]int{}}
		rp.pols[pol] = p
	}
	p.Count++
	p.Cost += rec.Cost
	p.Transitions[t.Name()]++
	tc := rp.tenants[in.Caller.Tenant]
	if tc == nil {
		tc = &TenantChanges{Tenant: in.Caller.Tenant}
		rp.tenants[in.Caller.Tenant] = tc
	}
	tc.Count++
	tc.Cost += rec.Cost
	return nil
}

func outcomeOf(d policies.Decision, err error) string {
	if err != nil {
		return "error: " + err.Error()
	}
	b, _ := json.Marshal(d)
	return string(b)
}

// finish sorts the report: most changes first, then by name.
func (rp *replayer) finish() *Report {
	r := &rp.report
	r.Transitions = byCount(rp.trans, func(t *Transition) (int, string) { return t.Count, t.Name() })
	r.Policies = byCount(rp.pols, func(p *PolicyChanges) (int, string) { return p.Count, p.Policy })
	r.Tenants = byCount(rp.tenants, func(t *TenantChanges) (int, string) { return t.Count, t.Tenant })
	if len(r.Tenants) > topTenants {
		r.Tenants = r.Tenants[:topTenants]
	}
	return r
}

// byCount is m's values, most counted first, then by name.
func byCount[K comparable, T any](m map[K]*T, key func(*T) (count int, name string)) []T {
	out := make([]T, 0, len(m))
	for _, v := range m {
		out = append(out, *v)
	}
	sort.Slice(out, func(i, j int) bool {
		ci, ni := key(&out[i])
		cj, nj := key(&out[j])
		if ci != cj {
			return ci > cj
		}
		return ni < nj
	})
	return out
}
