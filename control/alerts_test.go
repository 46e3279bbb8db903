package control_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/costgate/costgate/control"
)

// TestAlertsSlackAndExpiry: the Slack format, signed as the CloudEvents
// are, and a key's expiry as an event, on the embedded store.
func TestAlertsSlackAndExpiry(t *testing.T) {
	var (
		mu    sync.Mutex
		texts = map[string]string{} // by idempotency key
	)
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if err := control.Verify([]byte(alertSecret), r.Header.Get(control.SignatureHeader), body, time.Now(), time.Minute); err != nil {
			t.Errorf("delivery: %v", err)
		}
		var m struct {
			Text string `json:"text"`
		}
		if err := json.Unmarshal(body, &m); err != nil || m.Text == "" {
			t.Errorf("not a Slack message: %s", body)
		}
		mu.Lock()
		texts[r.Header.Get("Idempotency-Key")] = m.Text
		mu.Unlock()
	}))
	t.Cleanup(hook.Close)
	r := newReplica(t, simulatorURL(t), replicaOptions{alertURL: hook.URL, format: "slack"})
	r.must(t, 201, "POST", "/admin/v1/tenants", `{"name":"t1"}`, nil)
	var k created
	at := time.Now().Add(1200 * time.Millisecond).UTC().Format(time.RFC3339Nano)
	r.must(t, 201, "POST", "/admin/v1/keys", `{"tenant":"t1","expires_at":"`+at+`","budgets":[{"amount_usd":"0.0001","soft_percent":30}]}`, &k)
	for range 10 {
		if st, _ := r.chat(t, k.Key); st != 200 {
			break
		}
	}
	within(t, "the soft threshold, the thresholds and the expiry", 10*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		var soft, expired bool
		for _, text := range texts {
			soft = soft || strings.Contains(text, "(30% threshold)")
			expired = expired || strings.Contains(text, "key.expired for key/"+k.ID)
		}
		return soft && expired && len(texts) == 5
	})
	// Each delivery is recorded, once it is acknowledged.
	within(t, "the deliveries recorded", 5*time.Second, func() bool {
		var al struct {
			Alerts []control.Delivery `json:"alerts"`
		}
		r.must(t, 200, "GET", "/admin/v1/alerts", "", &al)
		for _, d := range al.Alerts {
			if d.Status != "delivered" || d.Attempts != 1 || d.DeliveredAt == nil {
				return false
			}
		}
		return len(al.Alerts) == 5
	})
}
