package proxy_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"
)

// objAtkUpstream is a Responses upstream that stores every answer, as
// OpenAI does under costgate's one account: a request that continues one
// (previous_response_id, read as a lenient server reads JSON: any case)
// is answered with the text of the answer it continues.
type objAtkUpstream struct {
	mu      sync.Mutex
	stored  map[string]string // id -> the prompt it answered
	n       int
	reached []string // the previous_response_id of each request that reached it
}

func (u *objAtkUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Input    string `json:"input"`
		Previous string `json:"previous_response_id"` // encoding/json: any case
		Stream   bool   `json:"stream"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	u.mu.Lock()
	u.reached = append(u.reached, req.Previous)
	text := "fresh"
	if req.Previous != "" {
		prev, ok := u.stored[req.Previous]
		if !ok {
			u.mu.Unlock()
			w.WriteHeader(http.StatusNotFound)
			fmt.Fprintf(w, `{"error":{"message":"Previous response with id '%s' not found.","type":"invalid_request_error","param":"previous_response_id","code":"previous_response_not_found"}}`, req.Previous)
			return
		}
		text = "you said: " + prev
	}
	u.n++
	id := fmt.Sprintf("resp_%04d", u.n)
	u.stored[id] = req.Input
	u.mu.Unlock()
	answer := fmt.Sprintf(`{"id":%q,"object":"response","created_at":1,"status":"completed","model":"gpt-4.1-mini","output":[{"type":"message","id":"msg_%s","role":"assistant","status":"completed","content":[{"type":"output_text","text":%q,"annotations":[]}]}],"usage":{"input_tokens":10,"input_tokens_details":{"cached_tokens":0},"output_tokens":3,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":13}}`, id, id, text)
	if !req.Stream {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, answer)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	fmt.Fprintf(w, "event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"id\":%q,\"object\":\"response\",\"status\":\"in_progress\",\"model\":\"gpt-4.1-mini\",\"output\":[]}}\n\n", id)
	fmt.Fprintf(w, "event: response.completed\ndata: {\"type\":\"response.completed\",\"sequence_number\":1,\"response\":%s}\n\n", answer)
}

func (u *objAtkUpstream) reachedWith(id string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	n := 0
	for _, p := range u.reached {
		if p == id {
			n++
		}
	}
	return n
}

// TestObjectsAttackAnotherTenantsStoredResponse: every tenant's Responses
// answers are stored upstream under costgate's one account. A tenant that
// learns another's response id (a log, a shared screen, a support ticket)
// continues that conversation with previous_response_id and reads it.
// costgate must answer 404 to any tenant but the one the answer was made
// for, in any spelling of the member, streamed or not, without reaching
// the upstream; the tenant itself continues its own, on each store.
func TestObjectsAttackAnotherTenantsStoredResponse(t *testing.T) {
	onEachStore(t, func(t *testing.T, url string) {
		up := &objAtkUpstream{stored: map[string]string{}}
		s := newStackWith(t, stackOptions{redisURL: url, extra: roomyLimits, policies: allowAll, upstream: up})
		ctx := context.Background()
		acme, globex := s.client("cg-test-acme"), s.client("cg-test-globex")
		newResp := func(c *openai.Client, input, previous string) (*responses.Response, error) {
			p := responses.ResponseNewParams{Model: "gpt-4.1-mini", Input: responses.ResponseNewParamsInputUnion{OfString: openai.String(input)}}
			if previous != "" {
				p.PreviousResponseID = openai.String(previous)
			}
			return c.Responses.New(ctx, p)
		}
		secret, err := newResp(acme, "my launch date is March 3", "")
		if err != nil {
			t.Fatal(err)
		}
		st := acme.Responses.NewStreaming(ctx, responses.ResponseNewParams{Model: "gpt-4.1-mini",
			Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("my salary is 90k")}})
		streamed := ""
		for st.Next() {
			if ev := st.Current(); ev.Type == "response.created" {
				streamed = ev.Response.ID
			}
		}
		if err := st.Err(); err != nil || streamed == "" {
			t.Fatalf("stream: %v, id %q", err, streamed)
		}
		for _, id := range []string{secret.ID, streamed} {
			// Another tenant, through the SDK.
			_, err := newResp(globex, "what did I say?", id)
			var apiErr *openai.Error
			if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusNotFound || apiErr.Code != "previous_response_not_found" {
				t.Errorf("globex continues acme's %s: %v; want 404 previous_response_not_found", id, err)
			}
			// Another tenant, in the member's other spellings.
			for _, name := range []string{"Previous_Response_Id", "PREVIOUS_RESPONSE_ID"} {
				body := fmt.Sprintf(`{"model":"gpt-4.1-mini","input":"what did I say?",%q:%q}`, name, id)
				resp := s.postAs(t, "cg-test-globex", "/v1/responses", body)
				if resp.StatusCode == http.StatusOK {
					t.Errorf("globex continues acme's %s as %s: 200", id, name)
				}
			}
			if n := up.reachedWith(id); n != 0 {
				t.Errorf("%d of globex's requests continuing acme's %s reached the upstream", n, id)
			}
			// The tenant it was made for.
			got, err := newResp(acme, "what did I say?", id)
			if err != nil || !strings.HasPrefix(got.OutputText(), "you said: ") {
				t.Errorf("acme continues its own %s: %v %v", id, got, err)
			}
		}
		// An answer costgate has no record of is no tenant's.
		if _, err := newResp(acme, "hi", "resp_made_elsewhere"); err == nil {
			t.Error("a response id costgate never saw: continued")
		}
	})
}

// postAs posts body to path with key and returns the answer, read whole.
func (s *stack) postAs(t *testing.T, key, path, body string) *http.Response {
	t.Helper()
	c := openai.NewClient(option.WithBaseURL(s.url+"/v1/"), option.WithAPIKey(key), option.WithMaxRetries(0))
	var resp *http.Response
	err := c.Post(context.Background(), strings.TrimPrefix(path, "/v1/"), json.RawMessage(body), nil, option.WithResponseInto(&resp))
	if resp == nil {
		t.Fatalf("post %s: %v", path, err)
	}
	return resp
}
