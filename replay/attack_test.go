package replay_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/costgate/costgate/config"
	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/gate"
	"github.com/costgate/costgate/policies"
	"github.com/costgate/costgate/replay"
)

// replayAtkCapture runs the chat bodies, each as a request of its tenant
// (keys cg-acme and cg-globex, plan pro), through a real gate with the
// example policies and capture on, and returns the capture directory and
// the policies directory once the gate is closed. A body "model:NAME" is
// an estimate of model NAME handed to the gate without a body.
func replayAtkCapture(t *testing.T, calls []struct{ key, body string }) (captureDir, policiesDir string) {
	t.Helper()
	dir := t.TempDir()
	policiesDir = copyPolicies(t, 1024)
	cfg, err := config.Parse([]byte(fmt.Sprintf(`
admin_token: t
data_dir: %q
policies: {dir: %q}
capture: {enabled: true}
tenants:
  - {name: acme, plan: pro, keys: [{id: acme-key, key: cg-acme}]}
  - {name: globex, plan: pro, keys: [{id: globex-key, key: cg-globex}]}
`, dir, policiesDir)))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	g, err := gate.Open(ctx, cfg, gate.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for i, c := range calls {
		caller := g.Identify(c.key)
		if caller == nil {
			t.Fatalf("key %s unknown", c.key)
		}
		var est costmodel.Estimate
		if strings.HasPrefix(c.body, "model:") {
			// An estimate naming the model as is, as a front door that
			// does not bound model names could hand it to the gate.
			est.Model = strings.TrimPrefix(c.body, "model:")
		} else if est, err = caller.Estimator().Estimate(costmodel.ChatCompletions, []byte(c.body)); err != nil {
			t.Fatalf("call %d: estimate: %v", i, err)
		}
		res, _ := g.Reserve(ctx, &gate.Request{ID: fmt.Sprintf("req_%03d", i), Caller: caller,
			Route: "/v1/chat/completions", Upstream: "openai", Estimate: est})
		if res != nil {
			res.Cancel(ctx)
		}
	}
	if err := g.Close(); err != nil {
		t.Fatal(err)
	}
	return filepath.Join(dir, "capture"), policiesDir
}

// TestReplayAttackLongModelNameBreaksReplay: a tenant's request whose model
// name (a string the client chooses, well within max_body_bytes) makes a
// capture record longer than the reader accepts must not make every replay
// of the capture fail: the operator's replays and promotions would be
// blocked by one tenant until the file is rotated out. Replay reads every
// record the gate wrote, or skips and counts what it cannot.
func TestReplayAttackLongModelNameBreaksReplay(t *testing.T) {
	// 200,000 '<' escape to 1.2 MB of JSON (\u003c), past the reader's 1 MiB.
	long := strings.Repeat("<", 200_000)
	est, err := costmodel.NewEstimator(costmodel.Config{})
	if err != nil {
		t.Fatal(err)
	}
	// The proxy's front door refuses such a name (MaxModelName); the
	// capture must hold for a gate handed one all the same.
	if _, err := est.Estimate(costmodel.ChatCompletions, []byte(`{"model":"`+long+`","messages":[{"role":"user","content":"hi"}]}`)); err == nil {
		t.Errorf("a %d-byte model name was estimated", len(long))
	}
	calls := []struct{ key, body string }{
		{"cg-globex", `{"model":"gpt-4o-mini","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`},
		{"cg-acme", "model:" + long},
		{"cg-globex", `{"model":"gpt-4o-mini","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`},
	}
	captureDir, policiesDir := replayAtkCapture(t, calls)
	rep, err := replay.Run(context.Background(), os.DirFS(policiesDir), captureDir, replay.Options{Tenant: "globex"})
	if err != nil {
		t.Fatalf("one request of tenant acme with a %d-byte model name makes the replay of tenant globex's traffic fail: %v",
			len(long), err)
	}
	if rep.Replayed != 2 {
		t.Errorf("replayed %d of globex's 2 requests", rep.Replayed)
	}
}

// TestReplayAttackCaptureKeepsNoSecrets: the capture holds the policy
// input (callers by tenant, user and key id), never the caller's API key
// nor the request's prompt.
func TestReplayAttackCaptureKeepsNoSecrets(t *testing.T) {
	const prompt = "PROMPT-7f3a9c-do-not-store"
	captureDir, _ := replayAtkCapture(t, []struct{ key, body string }{
		{"cg-acme", `{"model":"gpt-4o-mini","max_tokens":5,"user":"u1","messages":[{"role":"user","content":"` + prompt + `"}]}`},
	})
	files, err := replay.Files(captureDir)
	if err != nil || len(files) == 0 {
		t.Fatalf("capture files: %v %v", files, err)
	}
	var records int
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, secret := range []string{"cg-acme", prompt} {
			if strings.Contains(string(b), secret) {
				t.Errorf("%s holds %q", f, secret)
			}
		}
		st, err := replay.ReadFile(f, func(*replay.Record, int) error { return nil })
		if err != nil {
			t.Fatal(err)
		}
		records += st.Records
	}
	if records != 1 {
		t.Errorf("%d records captured; want the one request", records)
	}
}

// TestReplayAttackCaptureResumesAfterAWriteError: a write that fails once
// (a full disk, here the file size limit RLIMIT_FSIZE) loses what it was
// writing, not the capture: once writes succeed again, later records are
// written, and every file still reads.
func TestReplayAttackCaptureResumesAfterAWriteError(t *testing.T) {
	// The file size limit is the process's: the test runs in a child of
	// its own, so that the test framework's files are not cut by it.
	if os.Getenv("REPLAY_ATK_FSIZE_CHILD") != "1" {
		cmd := exec.Command(os.Args[0], "-test.run=^TestReplayAttackCaptureResumesAfterAWriteError$", "-test.count=1", "-test.v")
		cmd.Env = append(os.Environ(), "REPLAY_ATK_FSIZE_CHILD=1")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("the child process: %v\n%s", err, out)
		}
		return
	}
	dir := t.TempDir()
	w, err := replay.Open(replay.WriterConfig{Dir: dir, Queue: 1000})
	if err != nil {
		t.Fatal(err)
	}
	d := policies.Decision{Outcome: policies.Allow}
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_FSIZE, &lim); err != nil {
		t.Fatal(err)
	}
	small := lim
	small.Cur = 1000 // bytes: the 64 KiB buffer's first flush fails (EFBIG; Go ignores SIGXFSZ)
	if err := syscall.Setrlimit(syscall.RLIMIT_FSIZE, &small); err != nil {
		t.Skipf("cannot set RLIMIT_FSIZE: %v", err)
	}
	restored := false
	restore := func() {
		if !restored {
			restored = true
			if err := syscall.Setrlimit(syscall.RLIMIT_FSIZE, &lim); err != nil {
				t.Fatal(err)
			}
		}
	}
	defer restore()
	const before = 400 // about 200 KB of records: past the buffer
	for i := range before {
		w.Capture(fmt.Sprintf("before_%04d", i), testInput(i), &d)
	}
	waitHandled(t, w, before)
	restore()
	const after = 10
	for i := range after {
		w.Capture(fmt.Sprintf("after_%04d", i), testInput(i), &d)
	}
	waitHandled(t, w, before+after)
	w.Close() // its error is the failed write's

	files, err := replay.Files(dir)
	if err != nil {
		t.Fatal(err)
	}
	var resumed int
	for _, f := range files {
		if _, err := replay.ReadFile(f, func(rec *replay.Record, _ int) error {
			if strings.HasPrefix(rec.RequestID, "after_") {
				resumed++
			}
			return nil
		}); err != nil {
			t.Errorf("a file of the capture does not read: %v", err)
		}
	}
	if written, dropped := w.Stats(); resumed != after {
		t.Errorf("%d of the %d records captured after the write error recovered are in the capture (written %d, dropped %d): "+
			"one failed write stopped the capture for good", resumed, after, written, dropped)
	}
}

// waitHandled waits until w has written or dropped n records.
func waitHandled(t *testing.T, w *replay.Writer, n int64) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; {
		if written, dropped := w.Stats(); written+dropped >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the writer handled fewer than %d records in 10 s", n)
		}
		runtime.Gosched()
	}
}
