package admin

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"net/http"
	"slices"
	"strings"
	"testing/fstest"
	"time"

	"github.com/costgate/costgate/dashboard"
	"github.com/costgate/costgate/replay"
)

// replayRequest is the body of POST /admin/v1/policies/replay: a candidate
// policy bundle (file name to Rego source) and the filters of
// costgate policy replay.
type replayRequest struct {
	Policies map[string]string `json:"policies"`
	Since    string            `json:"since"`
	Tenant   string            `json:"tenant"`
}

const (
	maxReplayBody  = 4 << 20 // bytes
	maxReplayFiles = 256
)

// adminReplay evaluates a candidate policy bundle against the traffic this
// replica captured, as costgate policy replay does, and answers the report.
func (s *Plane) adminReplay(w http.ResponseWriter, r *http.Request) {
	var in replayRequest
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxReplayBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&in); err != nil {
		writeAdminError(w, http.StatusBadRequest, "reading the JSON body: "+err.Error())
		return
	}
	if _, err := dec.Token(); err != io.EOF {
		writeAdminError(w, http.StatusBadRequest, "reading the JSON body: more than one JSON value")
		return
	}
	fsys, err := bundle(in.Policies)
	if err != nil {
		writeAdminError(w, http.StatusBadRequest, err.Error())
		return
	}
	var opts replay.Options
	if in.Since != "" {
		if opts.Since, err = time.ParseDuration(in.Since); err != nil || opts.Since <= 0 {
			writeAdminError(w, http.StatusBadRequest, "since must be a positive duration, such as 24h")
			return
		}
	}
	opts.Tenant = in.Tenant
	cfg := s.gate.Config()
	if !cfg.Capture.Enabled {
		writeAdminError(w, http.StatusConflict, "capture is off on this replica: set capture.enabled to record traffic to replay")
		return
	}
	rep, err := replay.Run(r.Context(), fsys, cfg.CaptureDir(), opts)
	if replayFailed(w, err) {
		return
	}
	s.lastReplay.Store(summarize(rep, in, time.Now().UTC()))
	WriteJSON(w, http.StatusOK, rep)
}

// replayFailed answers a replay's error, if any: 404 without a capture,
// 422 when the evaluators disagree, a captured input fails or the
// candidate reads a field the capture lacks, 400 otherwise.
func replayFailed(w http.ResponseWriter, err error) bool {
	var fileErr *replay.FileError
	switch {
	case err == nil:
		return false
	case errors.As(err, &fileErr) && errors.Is(err, fs.ErrNotExist):
		writeAdminError(w, http.StatusNotFound, "no capture to replay yet: "+err.Error())
	case errors.As(err, new(*replay.DisagreeError)) || errors.As(err, new(*replay.EvalError)) || errors.As(err, new(*replay.MissingFieldError)):
		writeAdminError(w, http.StatusUnprocessableEntity, err.Error())
	case strings.Contains(err.Error(), "capture directory"):
		writeAdminError(w, http.StatusNotFound, "no capture to replay yet: "+err.Error())
	default:
		writeAdminError(w, http.StatusBadRequest, "the candidate policies or the capture are refused: "+err.Error())
	}
	return true
}

// maxReplayRows bounds each list of the dashboard's replay summary.
const maxReplayRows = 5

// summarize is the dashboard's view of a replay's report.
func summarize(rep *replay.Report, in replayRequest, at time.Time) *dashboard.ReplaySummary {
	sum := &dashboard.ReplaySummary{At: at, Since: in.Since, Tenant: in.Tenant,
		Replayed: rep.Replayed, Changed: rep.Changed, ChangedNanoUSD: int64(rep.ChangedCost)}
	sum.Files = slices.Sorted(maps.Keys(in.Policies))
	for _, t := range rep.Transitions[:min(len(rep.Transitions), maxReplayRows)] {
		sum.Transitions = append(sum.Transitions, dashboard.ReplayCount{Name: t.Name(), Count: t.Count, NanoUSD: int64(t.Cost)})
	}
	for _, p := range rep.Policies[:min(len(rep.Policies), maxReplayRows)] {
		sum.Policies = append(sum.Policies, dashboard.ReplayCount{Name: p.Policy, Count: p.Count, NanoUSD: int64(p.Cost)})
	}
	for _, t := range rep.Tenants[:min(len(rep.Tenants), maxReplayRows)] {
		sum.Tenants = append(sum.Tenants, dashboard.ReplayCount{Name: t.Tenant, Count: t.Count, NanoUSD: int64(t.Cost)})
	}
	return sum
}

// bundle makes a file system of a policy bundle: Rego files (and their
// data) by valid relative names.
func bundle(files map[string]string) (fs.FS, error) {
	if len(files) == 0 {
		return nil, errors.New("policies is required: a map of file names to Rego sources")
	}
	if len(files) > maxReplayFiles {
		return nil, fmt.Errorf("at most %d policy files", maxReplayFiles)
	}
	m := fstest.MapFS{}
	for name, src := range files {
		if !fs.ValidPath(name) || name == "." {
			return nil, fmt.Errorf("policy file name %q: want a relative path without . or .. elements", name)
		}
		m[name] = &fstest.MapFile{Data: []byte(src), Mode: 0o444}
	}
	return m, nil
}
