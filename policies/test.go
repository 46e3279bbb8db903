package policies

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"sort"
	"strings"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/tester"
)

// Test runs the Rego unit tests of fsys (every rule named test_* in any
// .rego file, usually in files ending in _test.rego) as `opa test` runs them,
// writes one line per test and a summary to w, and returns the counts. err is
// non-nil only when the tests could not run (a file that does not parse or
// compile); failing tests are counted in failed.
func Test(ctx context.Context, fsys fs.FS, w io.Writer) (passed, failed int, err error) {
	src, err := readSources(fsys, "")
	if err != nil {
		return 0, 0, err
	}
	results, err := runTests(ctx, src.all())
	if err != nil {
		return 0, 0, err
	}
	for _, r := range results {
		switch {
		case r.Skip:
			fmt.Fprintf(w, "%s.%s: SKIPPED\n", r.Package, r.Name)
		case r.Pass():
			passed++
			fmt.Fprintf(w, "%s.%s: PASS (%s)\n", r.Package, r.Name, r.Duration)
		default:
			failed++
			fmt.Fprintf(w, "%s\n", testProblem(r))
		}
	}
	fmt.Fprintln(w, strings.Repeat("-", 80))
	if failed == 0 {
		fmt.Fprintf(w, "PASS: %d/%d\n", passed, passed+failed)
	} else {
		if passed > 0 {
			fmt.Fprintf(w, "PASS: %d/%d\n", passed, passed+failed)
		}
		fmt.Fprintf(w, "FAIL: %d/%d\n", failed, passed+failed)
	}
	return passed, failed, nil
}

// runTests runs the test_* rules of mods and returns the results ordered by
// file, line and name.
func runTests(ctx context.Context, mods map[string]*ast.Module) ([]*tester.Result, error) {
	ch, err := tester.NewRunner().
		SetDefaultRegoVersion(ast.RegoV1).
		CapturePrintOutput(true).
		RaiseBuiltinErrors(true).
		SetModules(mods).
		RunTests(ctx, nil)
	if err != nil {
		return nil, &Error{Problems: problemsOf(err)}
	}
	var out []*tester.Result
	for r := range ch {
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if a.Location != nil && b.Location != nil {
			if a.Location.File != b.Location.File {
				return a.Location.File < b.Location.File
			}
			if a.Location.Row != b.Location.Row {
				return a.Location.Row < b.Location.Row
			}
		}
		return a.Package+"."+a.Name < b.Package+"."+b.Name
	})
	return out, nil
}

// testProblem describes a failed or erroring test.
func testProblem(r *tester.Result) Problem {
	msg := fmt.Sprintf("%s.%s: FAIL", r.Package, r.Name)
	code := "test_failed"
	if r.Error != nil {
		msg = fmt.Sprintf("%s.%s: ERROR: %v", r.Package, r.Name, r.Error)
		code = "test_error"
	} else if r.FailedAt != nil {
		msg += fmt.Sprintf(" (at %s: %s)", locString(r.FailedAt.Location), r.FailedAt)
	}
	if len(r.Output) > 0 {
		msg += "\n" + strings.TrimRight(string(r.Output), "\n")
	}
	return problemAt(r.Location, code, msg)
}

func locString(l *ast.Location) string {
	if l == nil {
		return "?"
	}
	return fmt.Sprintf("%s:%d", l.File, l.Row)
}
