package control_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/costgate/costgate/control"
)

// FuzzReadSnapshot: any file is a snapshot or an error, never a panic.
func FuzzReadSnapshot(f *testing.F) {
	f.Add([]byte(`{"costgate_control_snapshot":1,"version":3,"bytes":32,"sha256":"x"}` + "\n" + `{"entities":[{}],"promotions":[]}`))
	f.Add([]byte(`{"costgate_control_snapshot":1,"version":1,"bytes":2,"sha256":"44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"}` + "\n{}"))
	f.Add([]byte("\n"))
	f.Add([]byte{})
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, b []byte) {
		path := filepath.Join(dir, "snap")
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
		s, err := control.ReadSnapshot(path)
		if err == nil && s == nil {
			t.Fatal("no snapshot and no error")
		}
	})
}
