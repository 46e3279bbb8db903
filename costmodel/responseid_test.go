package costmodel

import (
	"strings"
	"testing"
)

// TestResponseID reads a Responses answer's id: the top-level "id" as a
// string, wherever it stands, whatever follows it (even an answer cut
// after it, as the start kept of a large one is).
func TestResponseID(t *testing.T) {
	big := `"output":[{"type":"message","content":[{"type":"output_text","text":"` + strings.Repeat("x", 1<<20) + `"}]}]`
	for _, c := range []struct{ name, body, want string }{
		{"first", `{"id":"resp_1","object":"response",` + big + `}`, "resp_1"},
		{"after the output", `{"object":"response",` + big + `,"id":"resp_2"}`, "resp_2"},
		{"escaped", `{"id":"resp_\u0033"}`, "resp_3"},
		{"cut after it", `{"id":"resp_4","output":[{"type":"mess`, "resp_4"},
		{"nested ids only", `{"output":[{"id":"msg_1"}],"response":{"id":"resp_x"}}`, ""},
		{"not a string", `{"id":5}`, ""},
		{"null", `{"id":null}`, ""},
		{"none", `{"object":"response"}`, ""},
		{"not an object", `["id","resp_5"]`, ""},
		{"empty", ``, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := ResponseID([]byte(c.body)); got != c.want {
				t.Errorf("ResponseID = %q, want %q", got, c.want)
			}
		})
	}
}

// BenchmarkResponseID reads the id of a 1 MiB answer that names it first.
func BenchmarkResponseID(b *testing.B) {
	body := []byte(`{"id":"resp_1","object":"response","output":[{"type":"message","content":[{"type":"output_text","text":"` + strings.Repeat("x", 1<<20) + `"}]}]}`)
	b.ReportAllocs()
	for b.Loop() {
		if ResponseID(body) != "resp_1" {
			b.Fatal("no id")
		}
	}
}
