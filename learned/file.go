package learned

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/costgate/costgate/costmodel/sketch"
	"github.com/costgate/costgate/internal/atomicfile"
)

// fileVersion is the version of the file's format.
const fileVersion = 1

// fileDoc is the file a Table without Redis is kept in.
type fileDoc struct {
	Version int `json:"version"`
	// RelativeError is the sketch's α: counts of another α are buckets of
	// other bounds.
	RelativeError float64   `json:"relative_error"`
	Keys          []fileKey `json:"keys"`
}

type fileKey struct {
	Tenant    string `json:"tenant"`
	Model     string `json:"model"`
	Route     string `json:"route"`
	MaxTokens int64  `json:"max_tokens"`
	Tools     bool   `json:"tools"`
	Multi     bool   `json:"multi"`
	// Buckets are [index, count] pairs; index -1 is the zero bucket.
	Buckets [][2]int64 `json:"buckets"`
}

// loadFile reads the file; a file that does not parse is moved aside (to
// FILE.bad) and reported, and a key of it that does not parse is left out.
func (t *Table) loadFile() error {
	raw, err := os.ReadFile(t.cfg.File)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("learned: %w", err)
	}
	var doc fileDoc
	err = json.Unmarshal(raw, &doc)
	switch {
	case err != nil:
		err = fmt.Errorf("learned: %s does not parse: %w", t.cfg.File, err)
	case doc.Version != fileVersion:
		err = fmt.Errorf("learned: %s is of version %d; this costgate reads version %d", t.cfg.File, doc.Version, fileVersion)
	case doc.RelativeError != sketch.RelativeError:
		err = fmt.Errorf("learned: %s holds sketches of relative error %v; this costgate's are %v", t.cfg.File, doc.RelativeError, sketch.RelativeError)
	}
	if err != nil {
		t.bad.Add(1)
		if rerr := os.Rename(t.cfg.File, t.cfg.File+".bad"); rerr == nil {
			err = fmt.Errorf("%w (moved to %s.bad)", err, t.cfg.File)
		}
		return err
	}
	for _, fk := range doc.Keys {
		k := Key{Tenant: fk.Tenant, Model: fk.Model, Route: fk.Route, Shape: Shape{MaxTokens: fk.MaxTokens, Tools: fk.Tools, Multi: fk.Multi}}
		if _, err := decodeKey(k.encode()); err != nil {
			t.badData("%v (in %s); left out", err, t.cfg.File)
			continue
		}
		s := &sketch.Sketch{}
		for _, b := range fk.Buckets {
			if b[1] < 0 || b[0] < sketch.ZeroBucket || b[0] > int64(sketch.MaxIndex) {
				err = fmt.Errorf("bucket %v out of range", b)
				break
			}
			if err = s.AddBucket(int(b[0]), uint64(b[1])); err != nil {
				break
			}
		}
		if err != nil {
			t.badData("learned: %s: key %s: %v; left out", t.cfg.File, k, err)
			err = nil
			continue
		}
		t.set(k, s)
	}
	return nil
}

// saveFile writes the Table to its file, whole or not at all.
func (t *Table) saveFile() error {
	doc := fileDoc{Version: fileVersion, RelativeError: sketch.RelativeError, Keys: []fileKey{}}
	t.each(func(k Key, e *entry) {
		fk := fileKey{Tenant: k.Tenant, Model: k.Model, Route: k.Route, MaxTokens: k.Shape.MaxTokens, Tools: k.Shape.Tools, Multi: k.Shape.Multi}
		e.mu.Lock()
		e.view.Each(func(i int, n uint64) { fk.Buckets = append(fk.Buckets, [2]int64{int64(i), int64(min(n, 1<<62))}) })
		e.mu.Unlock()
		if len(fk.Buckets) > 0 {
			doc.Keys = append(doc.Keys, fk)
		}
	})
	raw, err := json.Marshal(doc)
	if err != nil {
		return fmt.Errorf("learned: %w", err)
	}
	dir := filepath.Dir(t.cfg.File)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("learned: %w", err)
	}
	if err := atomicfile.Write(t.cfg.File, raw, 0o600); err != nil {
		return fmt.Errorf("learned: write %s: %w", t.cfg.File, err)
	}
	return nil
}
