// Package servicetest holds what the test helpers for real services share:
// the rule that a test which cannot get its service fails under CI and skips
// elsewhere, and free loopback ports.
package servicetest

import (
	"fmt"
	"net"
	"os"
	"testing"
)

// Unavailable ends the test because a service it needs cannot be had. When the
// CI environment variable is set the test fails, so that a missing service is
// never hidden as a skip; otherwise it is skipped with the reason, and the
// reason is also written to the process's standard error, so that `go test`
// run in the package's directory shows it without -v. (In package list mode,
// `go test ./...`, the go command hides the output of a package that passes:
// set CI=true to make a missing service a failure.)
func Unavailable(t testing.TB, format string, args ...any) {
	t.Helper()
	reason := fmt.Sprintf(format, args...)
	if os.Getenv("CI") != "" {
		t.Fatalf("required test service unavailable (CI is set, so this fails rather than skips): %s", reason)
	}
	fmt.Fprintf(os.Stderr, "--- SKIP: %s: test service unavailable: %s (set CI=true to make this a failure)\n", t.Name(), reason)
	t.Skipf("test service unavailable: %s", reason)
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago. The
// caller binds it soon after; a lost race shows up as a start failure that
// the caller retries.
func FreePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("servicetest: free port: %v", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
