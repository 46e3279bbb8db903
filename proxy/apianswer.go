package proxy

// The reserve and settle answers are written by hand: they are most of
// the API's traffic, and encoding/json's reflection over them was about a
// fifteenth of a reserve/settle pair's CPU. appendJSON writes the bytes
// json.Encoder.Encode writes for the same value, trailing newline
// included (FuzzAnswerJSON holds the two to it).

import (
	"net/http"
	"strconv"
	"sync"

	"github.com/costgate/costgate/admin"
	"github.com/costgate/costgate/internal/jsonscan"
)

func (a *reserveAnswer) appendJSON(b []byte) []byte {
	b = append(b, `{"reservation_id":`...)
	b = jsonscan.AppendString(b, a.ReservationID)
	b = append(b, `,"request_id":`...)
	b = jsonscan.AppendString(b, a.RequestID)
	b = append(b, `,"expires_at":`...)
	b = jsonscan.AppendString(b, a.ExpiresAt)
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
	b = jsonscan.AppendString(b, e.CostUSD)
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
			b = jsonscan.AppendString(b, f.DowngradeModel)
		}
		if f.Warning != "" {
			b = append(b, `,"warning":`...)
			b = jsonscan.AppendString(b, f.Warning)
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
	b = jsonscan.AppendString(b, a.ReservationID)
	b = append(b, `,"request_id":`...)
	b = jsonscan.AppendString(b, a.RequestID)
	b = append(b, `,"status":`...)
	b = jsonscan.AppendString(b, a.Status)
	b = append(b, `,"cost_usd":`...)
	b = jsonscan.AppendString(b, a.CostUSD)
	b = append(b, `,"cost_nanousd":`...)
	b = strconv.AppendInt(b, int64(a.CostNanoUSD), 10)
	b = append(b, `,"already_settled":`...)
	b = strconv.AppendBool(b, a.AlreadySettled)
	return append(b, "}\n"...)
}

// answerBufs are the answers' buffers: an answer is appended to one
// (answerBuf) and written from it (writeAnswer).
var answerBufs = sync.Pool{New: func() any { b := make([]byte, 0, 512); return &b }}

// answerBuf is an empty buffer of answerBufs. The answer is appended to it
// by its own appendJSON, called on the answer's variable and not through
// an interface, so that the answer stays on the handler's stack.
func answerBuf() *[]byte {
	p := answerBufs.Get().(*[]byte)
	*p = (*p)[:0]
	return p
}

// writeAnswer answers with status and the JSON in *p, a buffer of
// answerBuf, and returns the buffer to answerBufs.
func writeAnswer(w http.ResponseWriter, status int, p *[]byte) {
	admin.WriteEncoded(w, status, *p)
	if cap(*p) <= 4<<10 {
		answerBufs.Put(p)
	}
}
