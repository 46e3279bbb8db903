package proxy

// The reserve and settle answers are written by hand: they are most of
// the API's traffic, and encoding/json's reflection over them was about a
// fifteenth of a reserve/settle pair's CPU. appendJSON writes the bytes
// json.Encoder.Encode writes for the same value, trailing newline
// included (FuzzAnswerJSON holds the two to it).

import (
	"encoding/json"
	"net/http"
	"strconv"
	"sync"
	"unicode/utf8"

	"github.com/costgate/costgate/admin"
)

func (a *reserveAnswer) appendJSON(b []byte) []byte {
	b = append(b, `{"reservation_id":`...)
	b = appendJSONString(b, a.ReservationID)
	b = append(b, `,"request_id":`...)
	b = appendJSONString(b, a.RequestID)
	b = append(b, `,"expires_at":`...)
	b = appendJSONString(b, a.ExpiresAt)
	e := &a.Estimate
	b = append(b, `,"estimate":{"requests":`...)
	b = strconv.AppendInt(b, e.Requests, 10)
	b = append(b, `,"input_tokens":`...)
	b = strconv.AppendInt(b, e.InputTokens, 10)
	b = append(b, `,"output_tokens":`...)
	b = strconv.AppendInt(b, e.OutputTokens, 10)
	b = append(b, `,"units":`...)
	b = strconv.AppendInt(b, e.Units, 10)
	b = append(b, `,"cost_usd":`...)
	b = appendJSONString(b, e.CostUSD)
	b = append(b, `,"cost_nanousd":`...)
	b = strconv.AppendInt(b, int64(e.CostNanoUSD), 10)
	b = append(b, '}')
	if f := a.Friction; f != nil {
		b = append(b, `,"friction":{`...)
		sep := len(b)
		if f.DelayMS != 0 {
			b = append(b, `,"delay_ms":`...)
			b = strconv.AppendInt(b, f.DelayMS, 10)
		}
		if f.CapMaxTokens != 0 {
			b = append(b, `,"cap_max_tokens":`...)
			b = strconv.AppendInt(b, f.CapMaxTokens, 10)
		}
		if f.DowngradeModel != "" {
			b = append(b, `,"downgrade_model":`...)
			b = appendJSONString(b, f.DowngradeModel)
		}
		if f.Warning != "" {
			b = append(b, `,"warning":`...)
			b = appendJSONString(b, f.Warning)
		}
		if len(b) > sep {
			b = append(b[:sep], b[sep+1:]...) // the first member's comma
		}
		b = append(b, '}')
	}
	b = append(b, `,"degraded":`...)
	b = strconv.AppendBool(b, a.Degraded)
	return append(b, "}\n"...)
}

func (a *settleAnswer) appendJSON(b []byte) []byte {
	b = append(b, `{"reservation_id":`...)
	b = appendJSONString(b, a.ReservationID)
	b = append(b, `,"request_id":`...)
	b = appendJSONString(b, a.RequestID)
	b = append(b, `,"status":`...)
	b = appendJSONString(b, a.Status)
	b = append(b, `,"cost_usd":`...)
	b = appendJSONString(b, a.CostUSD)
	b = append(b, `,"cost_nanousd":`...)
	b = strconv.AppendInt(b, int64(a.CostNanoUSD), 10)
	b = append(b, `,"already_settled":`...)
	b = strconv.AppendBool(b, a.AlreadySettled)
	return append(b, "}\n"...)
}

// appendJSONString appends s as a JSON string. A string of printable
// ASCII that encoding/json leaves as it is (no quote, backslash or HTML
// character) is copied; any other is encoding/json's to escape.
func appendJSONString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= utf8.RuneSelf || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			q, _ := json.Marshal(s) // a string always encodes
			return append(b, q...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}

// answerBufs are writeAnswer's buffers.
var answerBufs = sync.Pool{New: func() any { b := make([]byte, 0, 512); return &b }}

// writeAnswer answers with status and the JSON a appends.
func writeAnswer(w http.ResponseWriter, status int, a interface{ appendJSON([]byte) []byte }) {
	p := answerBufs.Get().(*[]byte)
	*p = a.appendJSON((*p)[:0])
	admin.WriteEncoded(w, status, *p)
	if cap(*p) <= 4<<10 {
		answerBufs.Put(p)
	}
}
