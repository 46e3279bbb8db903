package servicetest

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestUnavailableInChild is run by TestUnavailable in a child process; on
// its own it does nothing.
func TestUnavailableInChild(t *testing.T) {
	if os.Getenv("SERVICETEST_CHILD") == "" {
		return
	}
	Unavailable(t, "chromium is not installed")
}

// TestUnavailable runs Unavailable in a child test process: under CI it
// fails the test, elsewhere it skips and says why on standard error even
// without -v.
func TestUnavailable(t *testing.T) {
	for _, tc := range []struct {
		name, ci string
		fails    bool
	}{
		{"CI fails", "true", true},
		{"elsewhere skips aloud", "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command(os.Args[0], "-test.run=^TestUnavailableInChild$")
			cmd.Env = append(os.Environ(), "SERVICETEST_CHILD=1", "CI="+tc.ci)
			var stderr strings.Builder
			cmd.Stderr = &stderr
			stdout, err := cmd.Output()
			if failed := err != nil; failed != tc.fails {
				t.Fatalf("child failed = %v (%v), want %v; stdout:\n%s", failed, err, tc.fails, stdout)
			}
			if tc.fails {
				if !strings.Contains(string(stdout), "chromium is not installed") {
					t.Errorf("the failure does not say why:\n%s", stdout)
				}
				return
			}
			if !strings.Contains(stderr.String(), "SKIP: TestUnavailableInChild: test service unavailable: chromium is not installed") {
				t.Errorf("the skip is not on standard error without -v; stderr:\n%s\nstdout:\n%s", stderr.String(), stdout)
			}
		})
	}
}
