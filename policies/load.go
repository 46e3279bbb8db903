package policies

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path"
	"sort"
	"strings"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/rego"
	"github.com/open-policy-agent/opa/v1/util"

	_ "embed"
)

//go:embed schema/input.schema.json
var inputSchemaJSON []byte

// unsafeBuiltins are builtins a policy may not call: they do network I/O on
// the request path, or read a clock other than input.time, which would make
// a decision depend on more than its input.
var unsafeBuiltins = map[string]struct{}{
	"http.send":          {},
	"net.lookup_ip_addr": {},
	"time.now_ns":        {},
	"opa.runtime":        {},
}

// PackagePrefix is the package under which every policy lives: the policy
// with id "quickstart" is package costgate.policies.quickstart.
const PackagePrefix = "costgate.policies"

var policiesRoot = ast.MustParseRef("data." + PackagePrefix)

// Rule names a policy package may define.
const (
	decisionRule       = "decision"
	shadowDecisionRule = "shadow_decision"
)

// Set is a compiled, tested set of policies, ready to decide. A Set is
// immutable and safe for concurrent use.
type Set struct {
	policies []*policy // sorted by id
	compiler *ast.Compiler
	prog     *program // the fast path; nil when no rule uses it
	tests    int
	digest   string // SHA-256 (hex) of every policy and library file
}

// PolicyInfo describes one loaded policy.
type PolicyInfo struct {
	ID    string   // the last segment of the package, e.g. "quickstart"
	Files []string // the files that define the package
	// Title and Description come from the package's METADATA annotation.
	Title, Description string
	// Shadow reports that the whole policy is in shadow mode.
	Shadow bool
	// ShadowRule reports that the policy defines a shadow_decision rule.
	ShadowRule bool
	// Fast reports that the policy runs on the compiled fast path; when it
	// does not, Slow says which construct needs the general evaluator.
	Fast bool
	Slow string
	// SourceSHA256 is the SHA-256 (hex) of the policy's files and of the
	// library files it may import: a promotion holds for this source only.
	SourceSHA256 string
	// Promoted reports that the policy is declared shadow in its files and
	// enforced by a promotion (see Set.Promote); Shadow is then false.
	Promoted bool
	// DenyOnError reports that the package's METADATA says on_error: deny:
	// a request its enforced decision fails to evaluate for is refused
	// (hard, 403) rather than decided by the other policies alone.
	DenyOnError bool
}

type policy struct {
	PolicyInfo
	rules []*rule // decision first, then shadow_decision
}

type rule struct {
	name   string
	shadow bool // enforced when false
	ref    ast.Ref
	query  rego.PreparedEvalQuery
	fast   *fastRule // nil when the rule needs the general evaluator
}

// Policies describes the loaded policies, ordered by id.
func (s *Set) Policies() []PolicyInfo {
	out := make([]PolicyInfo, len(s.policies))
	for i, p := range s.policies {
		out[i] = p.PolicyInfo
		out[i].Files = append([]string(nil), p.Files...)
	}
	return out
}

// Tests is the number of Rego unit tests that passed when the set was loaded.
func (s *Set) Tests() int { return s.tests }

// Problem is one error found in a policy directory, at a place in a file.
// Line and Column are 1-based; 0 when unknown.
type Problem struct {
	File    string
	Line    int
	Column  int
	Code    string // e.g. rego_parse_error, rego_type_error, test_failed
	Message string
	// Details are extra lines, such as the fields a misspelt reference
	// could have meant.
	Details []string
}

func (p Problem) String() string {
	var b strings.Builder
	b.WriteString(p.File)
	if p.Line > 0 {
		fmt.Fprintf(&b, ":%d", p.Line)
		if p.Column > 0 {
			fmt.Fprintf(&b, ":%d", p.Column)
		}
	}
	if b.Len() > 0 {
		b.WriteString(": ")
	}
	if p.Code != "" {
		b.WriteString(p.Code)
		b.WriteString(": ")
	}
	b.WriteString(p.Message)
	for _, d := range p.Details {
		b.WriteString("\n\t")
		b.WriteString(d)
	}
	return b.String()
}

// Error is returned when a policy directory does not parse, compile, conform
// to the costgate convention or pass its Rego tests. It lists every problem
// with its file and line.
type Error struct {
	Problems []Problem
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString("policies: ")
	for i, p := range e.Problems {
		if i > 0 {
			b.WriteString("\n")
		}
		b.WriteString(p.String())
	}
	return b.String()
}

// ErrNoPolicies is returned by Load when the directory
// holds no policy. An empty directory is most likely a configuration mistake.
var ErrNoPolicies = errors.New("policies: no policy found (want a package " + PackagePrefix + ".<id> with a decision rule)")

// Load reads every .rego file of fsys (recursively), compiles the policies,
// type-checks their references to input against the input schema, prepares
// every decision rule once and runs the Rego unit tests (files ending in
// _test.rego). A problem anywhere is an *Error listing each problem with its
// file and line; the Set is only returned when everything passed.
func Load(fsys fs.FS) (*Set, error) {
	return load(context.Background(), fsys, "")
}

// LoadDir is Load of the directory dir; problems name files by their path
// under dir (dir/plans.rego:12), as operators see them.
func LoadDir(dir string) (*Set, error) {
	return load(context.Background(), os.DirFS(dir), dir)
}

// Check compiles the policies of fsys exactly as Load does, and runs their
// tests. It returns nil when Load would succeed.
func Check(fsys fs.FS) error {
	_, err := Load(fsys)
	return err
}

type sources struct {
	policies map[string]*ast.Module // by file name, non-test files
	tests    map[string]*ast.Module // by file name, *_test.rego files
	sums     map[string][sha256.Size]byte
}

// all returns the policy and test modules together, as the test runner
// wants them.
func (src *sources) all() map[string]*ast.Module {
	all := maps.Clone(src.policies)
	maps.Copy(all, src.tests)
	return all
}

func readSources(fsys fs.FS, root string) (*sources, error) {
	src := &sources{policies: map[string]*ast.Module{}, tests: map[string]*ast.Module{}, sums: map[string][sha256.Size]byte{}}
	var problems []Problem
	err := fs.WalkDir(fsys, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if p != "." && strings.HasPrefix(d.Name(), ".") {
				return fs.SkipDir
			}
			return nil
		}
		if path.Ext(p) != ".rego" || strings.HasPrefix(d.Name(), ".") {
			return nil
		}
		data, err := fs.ReadFile(fsys, p)
		if err != nil {
			return err
		}
		name := p
		if root != "" {
			name = path.Join(root, p)
		}
		m, err := ast.ParseModuleWithOpts(name, string(data), ast.ParserOptions{RegoVersion: ast.RegoV1, ProcessAnnotation: true})
		if err != nil {
			problems = append(problems, problemsOf(err)...)
			return nil
		}
		if strings.HasSuffix(p, "_test.rego") {
			src.tests[name] = m
		} else {
			src.policies[name] = m
			src.sums[name] = sha256.Sum256(data)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("policies: read: %w", err)
	}
	if len(problems) > 0 {
		return nil, &Error{Problems: problems}
	}
	return src, nil
}

func load(ctx context.Context, fsys fs.FS, root string) (*Set, error) {
	src, err := readSources(fsys, root)
	if err != nil {
		return nil, err
	}
	var schema any
	if err := util.UnmarshalJSON(inputSchemaJSON, &schema); err != nil {
		return nil, fmt.Errorf("policies: input schema: %w", err)
	}
	schemas := ast.NewSchemaSet()
	schemas.Put(ast.SchemaRootRef, schema)
	c := ast.NewCompiler().
		WithSchemas(schemas).
		WithUnsafeBuiltins(unsafeBuiltins).
		WithEnablePrintStatements(false).
		WithDefaultRegoVersion(ast.RegoV1)
	c.Compile(src.policies)
	if c.Failed() {
		return nil, &Error{Problems: problemsOf(c.Errors)}
	}
	s := &Set{compiler: c}
	if err := s.collect(src.policies); err != nil {
		return nil, err
	}
	s.digests(src.sums)
	prog := newProgram(c)
	for _, p := range s.policies {
		p.Fast = true
		for _, r := range p.rules {
			if f, err := prog.compileFast(r.ref); err != nil {
				p.Fast, p.Slow = false, err.Error()
			} else {
				r.fast = f
				s.prog = prog
			}
			q, err := rego.New(
				rego.Compiler(c),
				rego.Query(r.ref.String()),
				rego.StrictBuiltinErrors(true),
			).PrepareForEval(ctx)
			if err != nil {
				return nil, &Error{Problems: problemsOf(err)}
			}
			r.query = q
		}
	}
	if len(src.tests) > 0 {
		results, err := runTests(ctx, src.all())
		if err != nil {
			return nil, err
		}
		var problems []Problem
		for _, r := range results {
			if r.Pass() || r.Skip {
				s.tests += boolInt(r.Pass())
				continue
			}
			problems = append(problems, testProblem(r))
		}
		if len(problems) > 0 {
			return nil, &Error{Problems: problems}
		}
	}
	return s, nil
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// collect finds the policy packages and their rules.
func (s *Set) collect(mods map[string]*ast.Module) error {
	byID := map[string]*policy{}
	var problems []Problem
	files := make([]string, 0, len(mods))
	for f := range mods {
		files = append(files, f)
	}
	sort.Strings(files)
	for _, f := range files {
		m := mods[f]
		pkg := m.Package.Path
		if !pkg.HasPrefix(policiesRoot) || len(pkg) == len(policiesRoot) {
			continue // a library package; policies may import it
		}
		loc := m.Package.Location
		if len(pkg) != len(policiesRoot)+1 {
			problems = append(problems, problemAt(loc, "costgate_policy_error",
				fmt.Sprintf("package %s: a policy package is %s.<id>, with a single-segment id", pkg, PackagePrefix)))
			continue
		}
		id, ok := pkg[len(policiesRoot)].Value.(ast.String)
		if !ok {
			problems = append(problems, problemAt(loc, "costgate_policy_error", fmt.Sprintf("package %s: bad policy id", pkg)))
			continue
		}
		p := byID[string(id)]
		if p == nil {
			p = &policy{PolicyInfo: PolicyInfo{ID: string(id)}}
			byID[string(id)] = p
		}
		p.Files = append(p.Files, f)
		for _, a := range m.Annotations {
			if a.Scope != "package" {
				continue
			}
			if p.Title == "" {
				p.Title = a.Title
			}
			if p.Description == "" {
				p.Description = strings.TrimSpace(a.Description)
			}
			if v, ok := a.Custom["shadow"]; ok {
				b, ok := v.(bool)
				if !ok {
					problems = append(problems, problemAt(a.Location, "costgate_policy_error", "custom.shadow must be true or false"))
					continue
				}
				p.Shadow = p.Shadow || b
			}
			if v, ok := a.Custom["on_error"]; ok {
				switch v {
				case "deny":
					p.DenyOnError = true
				case "allow":
				default:
					problems = append(problems, problemAt(a.Location, "costgate_policy_error", `custom.on_error must be "allow" or "deny"`))
				}
			}
		}
	}
	ids := make([]string, 0, len(byID))
	for id := range byID {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		p := byID[id]
		pkgRef := policiesRoot.Append(ast.StringTerm(id))
		for _, name := range []string{decisionRule, shadowDecisionRule} {
			ref := pkgRef.Append(ast.StringTerm(name))
			if len(s.compiler.GetRulesExact(ref)) == 0 {
				continue
			}
			p.rules = append(p.rules, &rule{name: name, ref: ref, shadow: p.Shadow || name == shadowDecisionRule})
			if name == shadowDecisionRule {
				p.ShadowRule = true
			}
		}
		if len(p.rules) == 0 {
			problems = append(problems, Problem{File: p.Files[0], Line: 1, Code: "costgate_policy_error",
				Message: fmt.Sprintf("policy %q defines neither %s nor %s", id, decisionRule, shadowDecisionRule)})
			continue
		}
		s.policies = append(s.policies, p)
	}
	if len(problems) > 0 {
		return &Error{Problems: problems}
	}
	if len(s.policies) == 0 {
		return ErrNoPolicies
	}
	return nil
}

func problemAt(loc *ast.Location, code, msg string) Problem {
	p := Problem{Code: code, Message: msg}
	if loc != nil {
		p.File, p.Line, p.Column = loc.File, loc.Row, loc.Col
	}
	return p
}

func astProblem(e *ast.Error) Problem {
	p := problemAt(e.Location, e.Code, e.Message)
	if e.Details != nil {
		p.Details = e.Details.Lines()
	}
	return p
}

// problemsOf converts the errors of the OPA parser, compiler and evaluator.
func problemsOf(err error) []Problem {
	var errs ast.Errors
	if errors.As(err, &errs) {
		out := make([]Problem, 0, len(errs))
		for _, e := range errs {
			out = append(out, astProblem(e))
		}
		return out
	}
	var one *ast.Error
	if errors.As(err, &one) {
		return []Problem{astProblem(one)}
	}
	return []Problem{{Message: err.Error()}}
}

// ErrNilInput is returned by Decide for a nil input.
var ErrNilInput = errors.New("policies: nil input")

// Decide evaluates every policy of the set on in and combines their verdicts
// (see the package documentation). An enforced policy that fails to
// evaluate (a conflict between rule values, a builtin error, a malformed
// decision) is an error naming the policy: a refusal is a Decision, an
// outage is an error. The Decision is then that of the policies that did
// evaluate, so that an input which breaks one policy (a caller's crafted
// request) does not switch off the others. A shadow policy or rule that
// fails is recorded in Decision.Shadow with its error, never returned:
// shadow never changes what is enforced.
//
// Decide is safe for concurrent use. It does not modify in.
func (s *Set) Decide(ctx context.Context, in *Input) (Decision, error) {
	return s.decide(ctx, in, true)
}

// DecideRego is Decide on OPA's general Rego evaluator alone, without the
// fast path. It is the reference the fast path must equal: the tests and
// `costgate policy replay` compare both on the same inputs. It is 20 to 100
// times slower than Decide; it is safe for concurrent use and does not
// modify in.
func (s *Set) DecideRego(ctx context.Context, in *Input) (Decision, error) {
	return s.decide(ctx, in, false)
}

func (s *Set) decide(ctx context.Context, in *Input, fast bool) (Decision, error) {
	if in == nil {
		return Decision{}, ErrNilInput
	}
	var buf [16]ruling
	rs := buf[:0]
	var m *machine
	if fast && s.prog != nil {
		m = s.prog.machine(in)
		defer s.prog.release(m)
	}
	var val ast.Value // the input for the general evaluator, built on first use
	var errs []error
	for _, p := range s.policies {
		for _, r := range p.rules {
			var (
				v       verdict
				defined bool
				err     error
			)
			onFast := m != nil && r.fast != nil
			if onFast {
				v, defined, err = r.fast.eval(m)
				m.bail, m.why = false, ""
			}
			if !onFast || err == errBail {
				if val == nil {
					val = in.Value()
				}
				v, defined, err = r.evalRego(ctx, val)
			}
			if err != nil {
				err = fmt.Errorf("policies: policy %s: %s: %w", p.ID, r.name, err)
				if !r.shadow {
					errs = append(errs, err)
					if p.DenyOnError {
						rs = append(rs, ruling{policy: p.ID, verdict: verdict{outcome: Hard, status: 403,
							reason: "policy " + p.ID + " could not decide on this request"}})
					}
					continue
				}
				rs = append(rs, ruling{policy: p.ID, shadow: true, err: err.Error()})
				continue
			}
			if defined {
				rs = append(rs, ruling{policy: p.ID, shadow: r.shadow, verdict: v})
			}
		}
	}
	return combine(rs), errors.Join(errs...)
}

func (r *rule) evalRego(ctx context.Context, input ast.Value) (verdict, bool, error) {
	rs, err := r.query.Eval(ctx, rego.EvalParsedInput(input))
	if err != nil {
		return verdict{}, false, err
	}
	if len(rs) == 0 {
		return verdict{}, false, nil
	}
	v, err := decodeVerdict(rs[0].Expressions[0].Value)
	if err != nil {
		return verdict{}, false, err
	}
	return v, true, nil
}

// InputPaths lists the input fields that the set's modules (policies and
// libraries) read, as the dotted constant prefix of each reference:
// input.caller.plan is "caller.plan", input.limits[_].unit is "limits" (a
// field of a list element, or one read through a variable, is not listed;
// a reference to input as a whole is ""). Sorted, without duplicates.
func (s *Set) InputPaths() []string {
	seen := map[string]bool{}
	for _, m := range s.compiler.Modules {
		ast.WalkRefs(m, func(r ast.Ref) bool {
			if !r[0].Equal(ast.InputRootDocument) {
				return false
			}
			var parts []string
			for _, t := range r[1:] {
				str, ok := t.Value.(ast.String)
				if !ok {
					break
				}
				parts = append(parts, string(str))
			}
			seen[strings.Join(parts, ".")] = true
			return false
		})
	}
	out := make([]string, 0, len(seen))
	for p := range seen {
		out = append(out, p)
	}
	sort.Strings(out)
	return out
}
