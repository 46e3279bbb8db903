package replay_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/costgate/costgate/replay"
)

// ReadFile never panics, whatever a capture file holds, and hands over only
// valid inputs.
func FuzzReadFile(f *testing.F) {
	f.Add([]byte(`{"costgate_capture":1}` + "\n" + `{"request_id":"r","input":{"caller":{"plan":"free"},"time":{"hour":3}},"decision":{"outcome":"allow"},"cost_nano_usd":5}` + "\n"))
	f.Add([]byte(`{"costgate_capture":1}` + "\n" + `{"request_id":"r","input":{"spend":[{"scope":"moon"}]}}` + "\n"))
	f.Add([]byte(`{"costgate_capture":2}` + "\n"))
	f.Add([]byte(`{"costgate_capture":1}` + "\n" + `{"request_id":"r","inp`))
	f.Add([]byte("\n\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		path := filepath.Join(t.TempDir(), "capture-x.jsonl")
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		replay.ReadFile(path, func(rec *replay.Record, line int) error {
			if rec.Input == nil || rec.Input.Validate() != nil {
				t.Fatalf("line %d: an invalid input handed over: %+v", line, rec.Input)
			}
			return nil
		})
		replay.Fields(path)
	})
}
