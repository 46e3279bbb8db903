package replay

// The capture file format, version 1: a header line {"costgate_capture":1},
// then one Record per line, in JSON. Files are named
// capture-YYYYMMDDTHHMMSS.NNNNNNNNNZ-SEQ.jsonl after the UTC time they were
// started, so that their names sort in time order.
//
// A file's last line without its newline is a record cut short (costgate
// stopped while writing it): readers skip it and count it (ReadStats.Truncated,
// Report.Truncated). Any other malformed line is an error naming its file
// and line.

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/policies"
)

// Version is the capture file format this package writes and reads.
const Version = 1

// header is a capture file's first line.
var header = []byte(`{"costgate_capture":1}` + "\n")

// ErrVersion is returned, wrapped in a *FileError, for a file that is not a
// capture file of this Version.
var ErrVersion = errors.New("not a costgate capture file of version 1")

// Record is one captured request: the policy input, the decision the
// policies took on it and its estimated cost.
type Record struct {
	// RequestID is the request's id, as the ledger keeps it.
	RequestID string          `json:"request_id"`
	Input     *policies.Input `json:"input"`
	Decision  Taken           `json:"decision"`
	// Cost is the request's estimated cost (input.estimate.cost_nano_usd).
	Cost costmodel.NanoUSD `json:"cost_nano_usd"`
}

// Taken is the enforced part of a policies.Decision: what the request got.
// Shadow decisions and reasons are not kept.
type Taken struct {
	Outcome  policies.Outcome  `json:"outcome"`
	Status   int               `json:"status,omitempty"`
	Policy   string            `json:"policy,omitempty"`
	Friction policies.Friction `json:"friction,omitzero"`
}

// TakenOf is the enforced part of d.
func TakenOf(d *policies.Decision) Taken {
	return Taken{Outcome: d.Outcome, Status: d.Status, Policy: d.Policy, Friction: d.Friction}
}

// String is e.g. "hard 402 (budget)" or "soft (plans) [cap_max_tokens=256]".
func (t Taken) String() string {
	s := string(t.Outcome)
	if t.Status != 0 {
		s += fmt.Sprintf(" %d", t.Status)
	}
	if t.Policy != "" {
		s += " (" + t.Policy + ")"
	}
	if f := t.Friction.String(); f != "" {
		s += " [" + f + "]"
	}
	return s
}

// FileError is a problem with one capture file, at a line when Line > 0.
type FileError struct {
	File string
	Line int
	Err  error
}

func (e *FileError) Error() string {
	if e.Line > 0 {
		return fmt.Sprintf("replay: %s:%d: %v", e.File, e.Line, e.Err)
	}
	return fmt.Sprintf("replay: %s: %v", e.File, e.Err)
}

func (e *FileError) Unwrap() error { return e.Err }

// Files lists the capture files of dir, oldest first.
func Files(dir string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("replay: capture directory: %w", err)
	}
	var out []string
	for _, e := range ents {
		if e.Type().IsRegular() && isCaptureName(e.Name()) {
			out = append(out, filepath.Join(dir, e.Name()))
		}
	}
	sort.Strings(out)
	return out, nil
}

func isCaptureName(name string) bool {
	return strings.HasPrefix(name, "capture-") && strings.HasSuffix(name, ".jsonl")
}

// ReadStats counts what ReadFile read.
type ReadStats struct {
	Records   int // records read and handed to the callback
	Truncated int // last lines cut short, skipped
}

// maxLine bounds one record's line, in bytes.
const maxLine = 1 << 20

// ReadFile reads the capture file path and calls fn with each record, in
// the order they were written; each record is new, fn may keep it. A
// foreign header is an error wrapping ErrVersion; a malformed line is a
// *FileError naming it; an error of fn stops the read and is returned.
func ReadFile(path string, fn func(rec *Record, line int) error) (ReadStats, error) {
	var st ReadStats
	f, err := os.Open(path)
	if err != nil {
		return st, fmt.Errorf("replay: %w", err)
	}
	defer f.Close()
	br := bufio.NewReaderSize(f, 64<<10)
	bad := func(line int, err error) error { return &FileError{File: path, Line: line, Err: err} }
	first, err := br.ReadSlice('\n')
	if err != nil && !errors.Is(err, io.EOF) {
		return st, bad(1, err)
	}
	if err := checkHeader(first); err != nil {
		return st, bad(1, err)
	}
	for line := 2; ; line++ {
		b, err := br.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			// A line longer than the buffer: collect it.
			var long []byte
			long = append(long, b...)
			for errors.Is(err, bufio.ErrBufferFull) && len(long) <= maxLine {
				b, err = br.ReadSlice('\n')
				long = append(long, b...)
			}
			if len(long) > maxLine {
				return st, bad(line, fmt.Errorf("line longer than %d bytes", maxLine))
			}
			b = long
		}
		if errors.Is(err, io.EOF) {
			if len(b) > 0 {
				st.Truncated++ // the last record, cut short
			}
			return st, nil
		}
		if err != nil {
			return st, bad(line, err)
		}
		var rec Record
		dec := json.NewDecoder(bytes.NewReader(b))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&rec); err != nil {
			return st, bad(line, fmt.Errorf("malformed record: %w", err))
		}
		if rec.Input == nil {
			return st, bad(line, errors.New("record without input"))
		}
		if err := rec.Input.Validate(); err != nil {
			return st, bad(line, err)
		}
		st.Records++
		if err := fn(&rec, line); err != nil {
			return st, err
		}
	}
}

// checkHeader accepts the header of this Version only.
func checkHeader(b []byte) error {
	var h map[string]json.RawMessage
	if err := json.Unmarshal(b, &h); err != nil {
		return fmt.Errorf("%w: the first line is not a capture header", ErrVersion)
	}
	v, ok := h["costgate_capture"]
	if !ok {
		return fmt.Errorf("%w: the first line is not a capture header", ErrVersion)
	}
	if string(v) != "1" {
		return fmt.Errorf("%w: the file is version %s; this costgate reads version %d", ErrVersion, v, Version)
	}
	return nil
}

// Fields lists the input fields the first record of the capture file path
// holds, as dotted paths of object keys (caller, caller.plan, limits, ...);
// nil for a file without records. request.attributes, written only when
// not empty, is always listed.
func Fields(path string) (map[string]bool, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("replay: %w", err)
	}
	defer f.Close()
	br := bufio.NewReaderSize(f, 64<<10)
	first, err := br.ReadSlice('\n')
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, &FileError{File: path, Line: 1, Err: err}
	}
	if err := checkHeader(first); err != nil {
		return nil, &FileError{File: path, Line: 1, Err: err}
	}
	b, err := br.ReadBytes('\n')
	if err != nil {
		return nil, nil // no complete record
	}
	var rec struct {
		Input map[string]any `json:"input"`
	}
	if err := json.Unmarshal(b, &rec); err != nil {
		return nil, &FileError{File: path, Line: 2, Err: fmt.Errorf("malformed record: %w", err)}
	}
	out := map[string]bool{"request.attributes": true}
	var walk func(prefix string, obj map[string]any)
	walk = func(prefix string, obj map[string]any) {
		for k, v := range obj {
			p := prefix + k
			out[p] = true
			if o, ok := v.(map[string]any); ok {
				walk(p+".", o)
			}
		}
	}
	walk("", rec.Input)
	return out, nil
}
