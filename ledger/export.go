package ledger

import (
	"bufio"
	"context"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/costgate/costgate/costmodel"
)

// Export formats.
const (
	FormatCSV         = "csv"
	FormatJSON        = "json"
	FormatCloudEvents = "cloudevents"
)

// CloudEventType is the CloudEvents type of a usage event.
const CloudEventType = "com.costgate.usage"

// Export writes every entry q selects (q.Limit and q.Cursor are ignored) to w
// in format. q.From and q.To bound the entries' creation time to [From, To);
// for a range a person gives (dates as whole UTC days, both included; RFC
// 3339 times exact), take the bounds from ParseRange. The formats are:
//
//   - "csv": a header row, then one row per entry; money both as integer
//     nano-dollars and as an exact decimal of dollars. A text cell (ids,
//     names, descriptive fields, status) that a spreadsheet would run as a
//     formula gets a leading "'" (OWASP's advice on CSV injection): one
//     whose first character is '=', '+', '-', '@', a tab or a carriage
//     return, or the full-width '＝' (U+FF1D), '＋' (U+FF0B), '－' (U+FF0D)
//     or '＠' (U+FF20), and, so that the rule can be undone, one that
//     starts with "'" itself. A reader gets the value back by stripping
//     one leading "'" from a text cell that has it.
//     The columns costgate writes as numbers (tokens, HTTP status,
//     nano-dollars, dollars, which may start with '-') and the RFC 3339
//     times are never changed, so they stay numbers in a spreadsheet;
//   - "json": one JSON array of entries;
//   - "cloudevents": a JSON array of CloudEvents 1.0 (structured mode, the
//     application/cloudevents-batch+json body that OpenMeter ingests), one
//     usage event per final entry. Reserved entries are left out, as their
//     usage is not known yet. The event id is the request id, so a billing
//     system that deduplicates by id counts each request once however often
//     it is exported. A recovered entry can still be settled later (its
//     node's settlement replayed after an operator's RecoverNode of a node
//     that was running): its event keeps its id with the settled usage, and
//     such a system keeps the one it saw first.
//
// Export reads the store page by page, so it runs in constant memory. It
// fails with ErrInvalid, before writing anything, for a tenant that is not
// valid text (see ValidText).
func (l *Ledger) Export(ctx context.Context, w io.Writer, q Query, format string) error {
	if err := checkFilter("export", "tenant", q.Tenant); err != nil {
		return err
	}
	var ex exporter
	bw := bufio.NewWriterSize(w, 64<<10)
	switch format {
	case FormatCSV:
		ex = &csvExporter{w: csv.NewWriter(bw)}
	case FormatJSON:
		ex = &jsonExporter{w: bw}
	case FormatCloudEvents:
		ex = &jsonExporter{w: bw, event: func(e *Entry) any {
			if e.Status == StatusReserved {
				return nil
			}
			return cloudEvent(l.cfg.EventSource, e)
		}}
	default:
		return fmt.Errorf("%w export format %q: want csv, json or cloudevents", ErrInvalid, format)
	}
	if err := ex.begin(); err != nil {
		return fmt.Errorf("ledger: export: %w", err)
	}
	q.Limit, q.Cursor = MaxLimit, ""
	for {
		p, err := l.Entries(ctx, q)
		if err != nil {
			return err
		}
		for i := range p.Entries {
			if err := ex.entry(&p.Entries[i]); err != nil {
				return fmt.Errorf("ledger: export: %w", err)
			}
		}
		if p.Next == "" {
			break
		}
		q.Cursor = p.Next
	}
	if err := ex.end(); err != nil {
		return fmt.Errorf("ledger: export: %w", err)
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("ledger: export: %w", err)
	}
	return nil
}

type exporter interface {
	begin() error
	entry(e *Entry) error
	end() error
}

// CSVHeader is the first row of a CSV export.
var CSVHeader = []string{
	"request_id", "tenant", "user", "key_id", "route", "upstream", "model", "region",
	"decision", "policy", "friction", "status", "http_status",
	"est_input_tokens", "est_cached_input_tokens", "est_cache_write_tokens", "est_output_tokens", "est_reasoning_tokens", "est_units",
	"input_tokens", "cached_input_tokens", "cache_write_tokens", "output_tokens", "reasoning_tokens", "units",
	"estimated_cost_nanousd", "actual_cost_nanousd", "charge_nanousd", "charge_usd",
	"created_at", "settled_at",
	"cache_write_1h_tokens", "audio_input_tokens", "audio_output_tokens", "web_search_requests", "file_search_calls",
	"container_gb", "service_tier", "inference_geo", "speed",
	"est_cache_write_1h_tokens", "est_audio_input_tokens", "est_audio_output_tokens", "est_web_search_requests",
	"est_file_search_calls", "est_container_gb", "est_service_tier", "est_inference_geo", "est_speed",
	"requests", "plan",
}

type csvExporter struct{ w *csv.Writer }

func (c *csvExporter) begin() error { return c.w.Write(CSVHeader) }

func (c *csvExporter) entry(e *Entry) error {
	i := func(v int64) string { return strconv.FormatInt(v, 10) }
	t := csvText
	return c.w.Write([]string{
		t(e.RequestID), t(e.Tenant), t(e.User), t(e.KeyID), t(e.Route), t(e.Upstream), t(e.Model), t(e.Region),
		t(e.Decision), t(e.Policy), t(e.Friction), t(string(e.Status)), strconv.Itoa(e.HTTPStatus),
		i(e.Estimated.InputTokens), i(e.Estimated.CachedInputTokens), i(e.Estimated.CacheWriteTokens),
		i(e.Estimated.OutputTokens), i(e.Estimated.ReasoningTokens), i(e.Estimated.Units),
		i(e.Actual.InputTokens), i(e.Actual.CachedInputTokens), i(e.Actual.CacheWriteTokens),
		i(e.Actual.OutputTokens), i(e.Actual.ReasoningTokens), i(e.Actual.Units),
		i(int64(e.EstimatedCost)), i(int64(e.ActualCost)), i(int64(e.Charge())), usd(e.Charge()),
		timeText(e.CreatedAt), timeText(e.SettledAt),
		i(e.Actual.CacheWrite1hTokens), i(e.Actual.AudioInputTokens), i(e.Actual.AudioOutputTokens),
		i(e.Actual.WebSearchRequests), i(e.Actual.FileSearchCalls), i(e.Actual.ContainerGB),
		t(e.Actual.ServiceTier), t(e.Actual.InferenceGeo), t(e.Actual.Speed),
		i(e.Estimated.CacheWrite1hTokens), i(e.Estimated.AudioInputTokens), i(e.Estimated.AudioOutputTokens),
		i(e.Estimated.WebSearchRequests), i(e.Estimated.FileSearchCalls), i(e.Estimated.ContainerGB),
		t(e.Estimated.ServiceTier), t(e.Estimated.InferenceGeo), t(e.Estimated.Speed),
		i(e.Requests), t(e.Plan),
	})
}

// csvText returns s as a CSV text cell: with a leading "'" when a
// spreadsheet would take it for a formula (see Export).
func csvText(s string) string {
	if formulaStart(s) {
		return "'" + s
	}
	return s
}

// formulaStart reports whether s starts with a character that makes a
// spreadsheet read the cell as a formula, or with the "'" that marks a
// neutralised cell.
func formulaStart(s string) bool {
	if s == "" {
		return false
	}
	switch s[0] {
	case '=', '+', '-', '@', '\t', '\r', '\'':
		return true
	}
	r, _ := utf8.DecodeRuneInString(s)
	switch r {
	case '\uFF1D', '\uFF0B', '\uFF0D', '\uFF20':
		return true
	}
	return false
}

func (c *csvExporter) end() error {
	c.w.Flush()
	return c.w.Error()
}

type jsonExporter struct {
	w     *bufio.Writer
	n     int
	event func(*Entry) any // nil exports the entry itself
}

func (j *jsonExporter) begin() error {
	_, err := j.w.WriteString("[")
	return err
}

func (j *jsonExporter) entry(e *Entry) error {
	var v any = e
	if j.event != nil {
		if v = j.event(e); v == nil {
			return nil
		}
	}
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if j.n > 0 {
		j.w.WriteString(",")
	}
	j.w.WriteString("\n")
	j.n++
	_, err = j.w.Write(b)
	return err
}

func (j *jsonExporter) end() error {
	_, err := j.w.WriteString("\n]\n")
	return err
}

// CloudEvent is a usage event in the CloudEvents 1.0 JSON format. Subject is
// the tenant (OpenMeter's customer); Data carries the usage. For Lago, map
// ID to transaction_id, Subject to external_subscription_id and Data to
// properties.
type CloudEvent struct {
	SpecVersion     string    `json:"specversion"`
	ID              string    `json:"id"`
	Source          string    `json:"source"`
	Type            string    `json:"type"`
	Subject         string    `json:"subject"`
	Time            time.Time `json:"time"`
	DataContentType string    `json:"datacontenttype"`
	Data            UsageData `json:"data"`
}

// UsageData is the data of a usage event. Cost is exact: an integer of
// nano-dollars and the same amount as a decimal string of dollars.
type UsageData struct {
	Tenant   string `json:"tenant"`
	User     string `json:"user,omitempty"`
	KeyID    string `json:"key_id,omitempty"`
	Route    string `json:"route,omitempty"`
	Upstream string `json:"upstream,omitempty"`
	Model    string `json:"model,omitempty"`
	Region   string `json:"region,omitempty"`
	// Plan is the caller's plan at the decision (see Entry.Plan): a
	// meter that prices by plan reads it from the event.
	Plan       string `json:"plan,omitempty"`
	Status     Status `json:"status"`
	HTTPStatus int    `json:"http_status,omitempty"`
	// Requests is how many requests the limiter counted for the entry:
	// 1 for a proxied request, a rate limit call's hits_addend, a
	// reservation's requests.
	Requests          int64 `json:"requests"`
	InputTokens       int64 `json:"input_tokens"`
	CachedInputTokens int64 `json:"cached_input_tokens"`
	CacheWriteTokens  int64 `json:"cache_write_tokens"`
	OutputTokens      int64 `json:"output_tokens"`
	ReasoningTokens   int64 `json:"reasoning_tokens"`
	Units             int64 `json:"units"`
	// The usage the counts above do not hold, when not zero (see
	// costmodel.Usage): it changes the price, and billing meters it.
	CacheWrite1hTokens int64  `json:"cache_write_1h_tokens,omitempty"`
	AudioInputTokens   int64  `json:"audio_input_tokens,omitempty"`
	AudioOutputTokens  int64  `json:"audio_output_tokens,omitempty"`
	WebSearchRequests  int64  `json:"web_search_requests,omitempty"`
	FileSearchCalls    int64  `json:"file_search_calls,omitempty"`
	ContainerGB        int64  `json:"container_gb,omitempty"`
	ServiceTier        string `json:"service_tier,omitempty"`
	InferenceGeo       string `json:"inference_geo,omitempty"`
	Speed              string `json:"speed,omitempty"`
	CostNanoUSD        int64  `json:"cost_nanousd"`
	CostUSD            string `json:"cost_usd"`
}

func cloudEvent(source string, e *Entry) CloudEvent {
	a := e.Actual
	return CloudEvent{
		SpecVersion: "1.0", ID: e.RequestID, Source: source, Type: CloudEventType,
		Subject: e.Tenant, Time: e.CreatedAt, DataContentType: "application/json",
		Data: UsageData{
			Tenant: e.Tenant, User: e.User, KeyID: e.KeyID, Route: e.Route, Upstream: e.Upstream,
			Model: e.Model, Region: e.Region, Plan: e.Plan, Status: e.Status, HTTPStatus: e.HTTPStatus, Requests: e.Requests,
			InputTokens: a.InputTokens, CachedInputTokens: a.CachedInputTokens, CacheWriteTokens: a.CacheWriteTokens,
			OutputTokens: a.OutputTokens, ReasoningTokens: a.ReasoningTokens,
			Units:              a.Units,
			CacheWrite1hTokens: a.CacheWrite1hTokens, AudioInputTokens: a.AudioInputTokens, AudioOutputTokens: a.AudioOutputTokens,
			WebSearchRequests: a.WebSearchRequests, FileSearchCalls: a.FileSearchCalls, ContainerGB: a.ContainerGB,
			ServiceTier: a.ServiceTier, InferenceGeo: a.InferenceGeo, Speed: a.Speed,
			CostNanoUSD: int64(e.Charge()), CostUSD: usd(e.Charge()),
		},
	}
}

// usd formats n as an exact decimal of dollars without a currency sign.
func usd(n costmodel.NanoUSD) string {
	s := n.String()
	if s[0] == '-' {
		return "-" + s[2:]
	}
	return s[1:]
}

func timeText(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format(time.RFC3339Nano)
}
