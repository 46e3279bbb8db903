package simulator

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/costgate/costgate/costmodel"
)

// stream answers as server-sent events, one event per reply word, flushed
// as it is written, in the event shapes of the API the request came to.
// The usage report comes as the API sends it: OpenAI chat and completions
// only when stream_options.include_usage is set, in a final chunk with no
// choices; Anthropic in message_start and message_delta; the responses API
// in response.completed.
func (s *Simulator) stream(w http.ResponseWriter, r *http.Request, kind costmodel.Kind, id string, req request, words []string, prompt, completion int64) {
	flusher, _ := w.(http.Flusher)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	send := func(event string, v any) bool {
		b, _ := json.Marshal(v)
		if event != "" {
			fmt.Fprintf(w, "event: %s\n", event)
		}
		fmt.Fprintf(w, "data: %s\n\n", b)
		if flusher != nil {
			flusher.Flush()
		}
		return r.Context().Err() == nil
	}
	pause := func() bool {
		if s.cfg.TokenInterval <= 0 {
			return true
		}
		t := time.NewTimer(s.cfg.TokenInterval)
		defer t.Stop()
		select {
		case <-t.C:
			return true
		case <-r.Context().Done():
			return false
		}
	}

	switch kind {
	case costmodel.AnthropicMessages:
		send("message_start", map[string]any{"type": "message_start", "message": map[string]any{
			"id": id, "type": "message", "role": "assistant", "model": req.Model, "content": []any{},
			"usage": map[string]int64{"input_tokens": prompt, "output_tokens": 1}}})
		send("content_block_start", map[string]any{"type": "content_block_start", "index": 0,
			"content_block": map[string]string{"type": "text", "text": ""}})
		for _, wd := range words {
			if !pause() || !send("content_block_delta", map[string]any{"type": "content_block_delta", "index": 0,
				"delta": map[string]string{"type": "text_delta", "text": wd}}) {
				return
			}
		}
		send("content_block_stop", map[string]any{"type": "content_block_stop", "index": 0})
		send("message_delta", map[string]any{"type": "message_delta",
			"delta": map[string]any{"stop_reason": "end_turn"}, "usage": map[string]int64{"output_tokens": completion}})
		send("message_stop", map[string]any{"type": "message_stop"})
		return
	case costmodel.Responses:
		for _, wd := range words {
			if !pause() || !send("response.output_text.delta", map[string]any{"type": "response.output_text.delta", "delta": wd}) {
				return
			}
		}
		send("response.completed", map[string]any{"type": "response.completed",
			"response": final(kind, id, req.Model, strings.Join(words, ""), prompt, completion)})
		return
	}

	chunk := func(delta string, finish any) map[string]any {
		choice := map[string]any{"index": 0, "finish_reason": finish}
		object := "chat.completion.chunk"
		if kind == costmodel.Completions {
			choice["text"] = delta
			object = "text_completion"
		} else {
			choice["delta"] = map[string]string{"content": delta}
		}
		return map[string]any{"id": id, "object": object, "created": 0, "model": req.Model, "choices": []any{choice}}
	}
	for _, wd := range words {
		if !pause() || !send("", chunk(wd, nil)) {
			return
		}
	}
	send("", chunk("", "stop"))
	if req.StreamOptions.IncludeUsage {
		object := "chat.completion.chunk"
		if kind == costmodel.Completions {
			object = "text_completion"
		}
		send("", map[string]any{"id": id, "object": object, "created": 0, "model": req.Model,
			"choices": []any{}, "usage": usage(prompt, completion)})
	}
	fmt.Fprint(w, "data: [DONE]\n\n")
	if flusher != nil {
		flusher.Flush()
	}
}
