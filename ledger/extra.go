package ledger

import (
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/costgate/costgate/costmodel"
)

// usageExtra is the part of a costmodel.Usage that an entry's integer
// columns do not hold, stored as JSON in est_extra and act_extra (and in
// spool records after the fields of earlier versions). The names are
// costmodel.Usage's own.
type usageExtra struct {
	CacheWrite1hTokens int64  `json:"cache_write_1h_tokens,omitempty"`
	AudioInputTokens   int64  `json:"audio_input_tokens,omitempty"`
	AudioOutputTokens  int64  `json:"audio_output_tokens,omitempty"`
	WebSearchRequests  int64  `json:"web_search_requests,omitempty"`
	FileSearchCalls    int64  `json:"file_search_calls,omitempty"`
	ContainerGB        int64  `json:"container_gb,omitempty"`
	ServiceTier        string `json:"service_tier,omitempty"`
	InferenceGeo       string `json:"inference_geo,omitempty"`
	Speed              string `json:"speed,omitempty"`
}

// maxExtraText bounds each text of a usageExtra: an upstream names its
// tier, geography and speed in a few bytes; a longer value is cut, never
// a reason to lose the entry.
const maxExtraText = 64

// extraOf returns u's extra usage as stored: "" when it has none.
func extraOf(u *costmodel.Usage) string {
	x := usageExtra{u.CacheWrite1hTokens, u.AudioInputTokens, u.AudioOutputTokens, u.WebSearchRequests,
		u.FileSearchCalls, u.ContainerGB, extraText(u.ServiceTier), extraText(u.InferenceGeo), extraText(u.Speed)}
	if x == (usageExtra{}) {
		return ""
	}
	y := x // only a usage that has some escapes to the heap: most have none
	b, err := json.Marshal(&y)
	if err != nil {
		return "" // a struct of integers and valid text always marshals
	}
	return string(b)
}

// extraText is s as stored: at most maxExtraText bytes of valid UTF-8,
// invalid bytes replaced before the cut, so that the text stored again is
// the same whichever path (the spool, the store) it took.
func extraText(s string) string {
	s = strings.ToValidUTF8(s[:min(len(s), 4*maxExtraText)], "\uFFFD")
	if len(s) <= maxExtraText {
		return s
	}
	n := maxExtraText
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// setExtra sets u's extra usage from s, as extraOf stored it.
func setExtra(u *costmodel.Usage, s string) error {
	if s == "" {
		return nil
	}
	var x usageExtra
	if err := json.Unmarshal([]byte(s), &x); err != nil {
		return fmt.Errorf("ledger: extra usage %q: %w", s, err)
	}
	u.CacheWrite1hTokens, u.AudioInputTokens, u.AudioOutputTokens = x.CacheWrite1hTokens, x.AudioInputTokens, x.AudioOutputTokens
	u.WebSearchRequests, u.FileSearchCalls, u.ContainerGB = x.WebSearchRequests, x.FileSearchCalls, x.ContainerGB
	u.ServiceTier, u.InferenceGeo, u.Speed = x.ServiceTier, x.InferenceGeo, x.Speed
	return nil
}
