package costmodel

import (
	"strings"
	"testing"
)

// TestStreamMeterAtkOverlongResponsesReport: a Responses event longer
// than the meter keeps (its response echoes 1.2 MB of instructions) still
// gives the meter its usage report, whatever the pieces it comes in; a
// usage member outside the response, or null, is no report.
func TestStreamMeterAtkOverlongResponsesReport(t *testing.T) {
	e, err := NewEstimator(Config{})
	if err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("hello world ", 100_000)
	for _, c := range []struct {
		name, event string
		want        int64 // output tokens reported; -1 for none
	}{
		{"completed", `{"type":"response.completed","response":{"id":"r","instructions":"` + long + `","usage":{"input_tokens":9,"output_tokens":700,"output_tokens_details":{"reasoning_tokens":600}},"status":"completed"}}`, 700},
		{"null", `{"type":"response.created","response":{"id":"r","instructions":"` + long + `","usage":null}}`, -1},
		{"outside", `{"type":"response.completed","usage":{"input_tokens":9,"output_tokens":700},"response":{"instructions":"` + long + `"}}`, -1},
		{"nested", `{"type":"response.completed","response":{"instructions":"` + long + `","output":[{"usage":{"input_tokens":9,"output_tokens":700}}]}}`, -1},
	} {
		for _, piece := range []int{1 << 20, 4096, 7} {
			m := e.NewStreamMeter(Responses, "o3")
			raw := "event: x\ndata: " + c.event + "\n\n"
			for i := 0; i < len(raw); i += piece {
				m.Write([]byte(raw[i:min(i+piece, len(raw))]))
			}
			u, reported := m.Usage()
			switch {
			case c.want < 0 && reported:
				t.Errorf("%s/%d: reported %+v from no report", c.name, piece, u)
			case c.want < 0 && m.Skipped() != 1:
				t.Errorf("%s/%d: skipped %d lines; want 1", c.name, piece, m.Skipped())
			case c.want >= 0 && (!reported || u.OutputTokens != c.want || u.ReasoningTokens != 600 || m.Skipped() != 0):
				t.Errorf("%s/%d: usage %+v reported %v skipped %d; want %d output tokens", c.name, piece, u, reported, m.Skipped(), c.want)
			}
		}
	}
}

// TestStreamMeterAtkDeepResponsesReport: a Responses event nested deeper
// than the meter's scanner reads (a tool schema the request held at the
// deepest costgate reads, echoed a level deeper) still gives its usage.
func TestStreamMeterAtkDeepResponsesReport(t *testing.T) {
	e, err := NewEstimator(Config{})
	if err != nil {
		t.Fatal(err)
	}
	deep := strings.Repeat(`{"a":`, 1200) + `1` + strings.Repeat(`}`, 1200)
	m := e.NewStreamMeter(Responses, "o3")
	m.Write([]byte(`data: {"type":"response.completed","response":{"id":"r","tools":[{"parameters":` + deep + `}],"usage":{"input_tokens":9,"output_tokens":700}}}` + "\n\n"))
	if u, reported := m.Usage(); !reported || u.OutputTokens != 700 || m.Malformed() != 0 {
		t.Errorf("usage %+v reported %v malformed %d; want 700 output tokens reported", u, reported, m.Malformed())
	}
}
