package control

// Budget alerts: when a control-plane budget's spend (estimates of
// requests in flight included) crosses a threshold, or a key expires, an
// event is recorded in control_alerts under an idempotency key (the
// budget's counter, its window and the threshold; the key and its expiry),
// so that replicas that see the same crossing record one event. A delivery
// loop on every replica claims due events, POSTs them, and marks them
// delivered, or schedules a retry with exponential backoff: at least once,
// and a receiver deduplicates by the idempotency key.

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/costgate/costgate/config"
	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/gate"
)

func nanoString(n int64) string { return costmodel.NanoUSD(n).String() }

// Event types.
const (
	EventBudgetThreshold = "dev.costgate.budget.threshold"
	EventKeyExpired      = "dev.costgate.key.expired"
)

// SignatureHeader carries a delivery's signature: "t=UNIX,v1=HEX", HEX
// being HMAC-SHA256 under the shared secret of "UNIX.BODY".
const SignatureHeader = "Costgate-Signature"

// Sign returns the signature header's value of body at t.
func Sign(secret []byte, t time.Time, body []byte) string {
	ts := strconv.FormatInt(t.Unix(), 10)
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(ts))
	m.Write([]byte("."))
	m.Write(body)
	return "t=" + ts + ",v1=" + hex.EncodeToString(m.Sum(nil))
}

// Verify checks a signature header's value against body, with t within
// tolerance of now: what a receiver does.
func Verify(secret []byte, header string, body []byte, now time.Time, tolerance time.Duration) error {
	var ts, sig string
	for _, part := range bytes.Split([]byte(header), []byte(",")) {
		k, v, _ := bytes.Cut(part, []byte("="))
		switch string(k) {
		case "t":
			ts = string(v)
		case "v1":
			sig = string(v)
		}
	}
	n, err := strconv.ParseInt(ts, 10, 64)
	if err != nil || sig == "" {
		return fmt.Errorf("control: signature: malformed %q", header)
	}
	if d := now.Sub(time.Unix(n, 0)); d > tolerance || d < -tolerance {
		return fmt.Errorf("control: signature: timestamp %d is too far from now", n)
	}
	got, err := hex.DecodeString(sig)
	if err != nil {
		return fmt.Errorf("control: signature: malformed %q", header)
	}
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(ts))
	m.Write([]byte("."))
	m.Write(body)
	if !hmac.Equal(m.Sum(nil), got) {
		return fmt.Errorf("control: signature: mismatch")
	}
	return nil
}

// CloudEvent is a structured-mode CloudEvent (JSON format, spec 1.0).
type CloudEvent struct {
	SpecVersion     string `json:"specversion"`
	Type            string `json:"type"`
	Source          string `json:"source"`
	ID              string `json:"id"`
	Time            string `json:"time"`
	Subject         string `json:"subject"`
	DataContentType string `json:"datacontenttype"`
	Data            any    `json:"data"`
}

// ThresholdData is a budget threshold event's data.
type ThresholdData struct {
	Tenant      string `json:"tenant"`
	Level       string `json:"level"`
	Entity      string `json:"entity"`
	Budget      string `json:"budget"`
	Limit       string `json:"limit"`
	Period      string `json:"period"`
	WindowStart string `json:"window_start"`
	Threshold   int    `json:"threshold_percent"`
	SpentUSD    string `json:"spent_usd"`
	AmountUSD   string `json:"amount_usd"`
	Refused     bool   `json:"refused"`
}

// alerter turns budget uses into recorded events and delivers them.
type alerter struct {
	p          *Plane
	cfg        config.AlertsConfig
	secret     []byte
	thresholds []int
	backoff    time.Duration
	client     *http.Client

	uses chan gate.BudgetUse
	kick chan struct{}

	mu   sync.Mutex
	sent map[string]time.Time // idempotency keys recorded, by window start
}

func newAlerter(p *Plane, cfg config.AlertsConfig) *alerter {
	backoff := max(cfg.Backoff, 10*time.Millisecond)
	th := slices.Clone(cfg.Thresholds)
	slices.Sort(th)
	return &alerter{p: p, cfg: cfg, secret: []byte(cfg.SigningSecret()), thresholds: th, backoff: backoff,
		client: &http.Client{Timeout: cfg.Timeout}, uses: make(chan gate.BudgetUse, 4096),
		kick: make(chan struct{}, 1), sent: map[string]time.Time{}}
}

// observe is the gate's budget observer: it never blocks. A use dropped
// because the queue is full is seen again with the budget's next request.
func (a *alerter) observe(u gate.BudgetUse) {
	first := a.thresholds[0]
	if soft := u.Limit.SoftPercent; soft > 0 {
		first = min(first, soft)
	}
	if u.Capacity <= 0 || (u.Spent*100 < int64(first)*u.Capacity && !u.Refused) {
		return // below every threshold: the common case costs nothing more
	}
	select {
	case a.uses <- u:
	default:
	}
}

func (a *alerter) start(ctx context.Context, wg *sync.WaitGroup) {
	wg.Go(func() { a.recordLoop(ctx) })
	wg.Go(func() { a.deliverLoop(ctx) })
	wg.Go(func() { a.expiryLoop(ctx) })
}

func (a *alerter) recordLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case u := <-a.uses:
			a.record(ctx, u)
		}
	}
}

// record records the events of the thresholds u crossed.
func (a *alerter) record(ctx context.Context, u gate.BudgetUse) {
	window := u.Limit.WindowStart(u.At)
	ths := a.thresholds
	if soft := u.Limit.SoftPercent; soft > 0 && !slices.Contains(ths, soft) {
		ths = append(slices.Clone(ths), soft)
	}
	lv := levelKind(u.Limit.Name())
	for _, th := range ths {
		if u.Spent*100 < int64(th)*u.Capacity && !(u.Refused && th == 100) {
			continue
		}
		idem := idemKey(u.Limit.Key, strconv.FormatInt(window.Unix(), 10), strconv.Itoa(th))
		a.mu.Lock()
		_, done := a.sent[idem]
		a.mu.Unlock()
		if done {
			continue
		}
		data := ThresholdData{Tenant: u.Tenant, Level: lv, Entity: u.Limit.Entity, Budget: u.Limit.ID, Limit: u.Limit.Name(),
			Period: u.Limit.Period, WindowStart: window.Format(time.RFC3339), Threshold: th,
			SpentUSD: nanoString(min(u.Spent, u.Capacity)), AmountUSD: nanoString(u.Capacity), Refused: u.Refused}
		ev := CloudEvent{SpecVersion: "1.0", Type: EventBudgetThreshold, Source: "costgate/control", ID: idem,
			Time: u.At.UTC().Format(time.RFC3339Nano), Subject: lv + "/" + u.Limit.Entity, DataContentType: "application/json", Data: data}
		if err := a.enqueue(ctx, ev); err != nil {
			a.p.log.Warn("control plane: alert not recorded; it is recorded with the budget's next request", "err", err)
			continue
		}
		a.mu.Lock()
		a.sent[idem] = window
		a.mu.Unlock()
	}
	a.prune(u.At)
}

// prune forgets the idempotency keys of windows older than 32 days (the
// database still holds them).
func (a *alerter) prune(now time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.sent) < 10000 {
		return
	}
	for k, w := range a.sent {
		if now.Sub(w) > 32*24*time.Hour {
			delete(a.sent, k)
		}
	}
}

func idemKey(parts ...string) string {
	h := sha256.New()
	for _, p := range parts {
		h.Write([]byte(p))
		h.Write([]byte{0})
	}
	return "evt_" + hex.EncodeToString(h.Sum(nil)[:16])
}

// levelKind is the level a level limit's name starts with.
func levelKind(name string) string {
	for i := range len(name) {
		if name[i] == '/' {
			return name[:i]
		}
	}
	return name
}

// enqueue records ev once: a second record of its id is a no-op.
func (a *alerter) enqueue(ctx context.Context, ev CloudEvent) error {
	s := a.p.store
	if err := s.ensure(ctx); err != nil {
		return err
	}
	body, err := json.Marshal(ev)
	if err != nil {
		return err
	}
	now := time.Now()
	_, err = s.db.ExecContext(ctx, s.q(`INSERT INTO control_alerts (idem, type, payload, status, next_at, created_at)
		VALUES (?, ?, ?, 'pending', ?, ?) ON CONFLICT (idem) DO NOTHING`), ev.ID, ev.Type, string(body), micros(now), micros(now))
	if err != nil {
		return storeErr(err)
	}
	select {
	case a.kick <- struct{}{}:
	default:
	}
	return nil
}

// expiryLoop records a key.expired event for each key whose expiry
// passes. At start it looks back a day: the idempotency key makes a
// second record of the same expiry a no-op.
func (a *alerter) expiryLoop(ctx context.Context) {
	last := time.Now().Add(-24 * time.Hour)
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		now := time.Now()
		ok := true
		for _, id := range a.p.dir.expired(last, now) {
			ev := CloudEvent{SpecVersion: "1.0", Type: EventKeyExpired, Source: "costgate/control", ID: idemKey("expired", id),
				Time: now.UTC().Format(time.RFC3339Nano), Subject: "key/" + id, DataContentType: "application/json",
				Data: map[string]string{"key": id}}
			if err := a.enqueue(ctx, ev); err != nil {
				ok = false
			}
		}
		if ok {
			last = now
		}
	}
}

// delivery is a claimed event.
type delivery struct {
	idem, payload string
	attempts      int
}

func (a *alerter) deliverLoop(ctx context.Context) {
	t := time.NewTicker(200 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-a.kick:
		}
		ds, err := a.claim(ctx)
		if err != nil {
			continue
		}
		for _, d := range ds {
			a.deliver(ctx, d)
		}
	}
}

// claim takes up to 16 due events for this replica, for twice the
// delivery timeout.
func (a *alerter) claim(ctx context.Context) ([]delivery, error) {
	s := a.p.store
	if err := s.ensure(ctx); err != nil {
		return nil, err
	}
	now := time.Now()
	sub := `SELECT idem FROM control_alerts WHERE status = 'pending' AND next_at <= ? AND locked_until <= ? ORDER BY next_at LIMIT 16`
	if s.postgres {
		sub += " FOR UPDATE SKIP LOCKED"
	}
	rows, err := s.db.QueryContext(ctx, s.q(`UPDATE control_alerts SET locked_until = ?, attempts = attempts + 1
		WHERE idem IN (`+sub+`) RETURNING idem, payload, attempts`), micros(now.Add(2*a.cfg.Timeout)), micros(now), micros(now))
	if err != nil {
		return nil, storeErr(err)
	}
	defer rows.Close()
	var out []delivery
	for rows.Next() {
		var d delivery
		if err := rows.Scan(&d.idem, &d.payload, &d.attempts); err != nil {
			return nil, err
		}
		out = append(out, d)
	}
	return out, rows.Err()
}

// deliver POSTs one event and records the outcome.
func (a *alerter) deliver(ctx context.Context, d delivery) {
	body := []byte(d.payload)
	ctype := "application/cloudevents+json"
	if a.cfg.Format == "slack" {
		body, ctype = slackBody(body), "application/json"
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, a.cfg.URL, bytes.NewReader(body))
	if err != nil {
		return
	}
	req.Header.Set("Content-Type", ctype)
	req.Header.Set("Idempotency-Key", d.idem)
	req.Header.Set("Costgate-Delivery-Attempt", strconv.Itoa(d.attempts))
	req.Header.Set(SignatureHeader, Sign(a.secret, time.Now(), body))
	resp, err := a.client.Do(req)
	errText := ""
	if err == nil {
		io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		resp.Body.Close()
		if resp.StatusCode/100 != 2 {
			errText = "HTTP " + strconv.Itoa(resp.StatusCode)
		}
	} else {
		errText = err.Error()
	}
	s := a.p.store
	now := time.Now()
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	switch {
	case errText == "":
		_, err = s.db.ExecContext(wctx, s.q(`UPDATE control_alerts SET status = 'delivered', delivered_at = ?, last_error = '' WHERE idem = ?`), micros(now), d.idem)
	case d.attempts >= a.cfg.MaxAttempts:
		a.p.log.Warn("control plane: alert delivery given up", "id", d.idem, "attempts", d.attempts, "err", errText)
		_, err = s.db.ExecContext(wctx, s.q(`UPDATE control_alerts SET status = 'failed', last_error = ? WHERE idem = ?`), errText, d.idem)
	default:
		delay := min(a.backoff<<min(d.attempts-1, 20), 5*time.Minute)
		delay += time.Duration(rand.Int64N(int64(delay)/5 + 1)) // up to 20% jitter
		_, err = s.db.ExecContext(wctx, s.q(`UPDATE control_alerts SET next_at = ?, locked_until = 0, last_error = ? WHERE idem = ?`),
			micros(now.Add(delay)), errText, d.idem)
	}
	if err != nil {
		a.p.log.Warn("control plane: alert outcome not recorded; the event is delivered again", "id", d.idem, "err", err)
	}
}

// slackBody turns a CloudEvent into a Slack incoming-webhook message.
func slackBody(ce []byte) []byte {
	var ev struct {
		Type    string          `json:"type"`
		Subject string          `json:"subject"`
		Data    json.RawMessage `json:"data"`
	}
	_ = json.Unmarshal(ce, &ev)
	text := fmt.Sprintf("costgate: %s for %s", ev.Type, ev.Subject)
	var td ThresholdData
	if ev.Type == EventBudgetThreshold && json.Unmarshal(ev.Data, &td) == nil {
		text = fmt.Sprintf("costgate: %s %s of tenant %s has spent $%s of its $%s %s budget %q (%d%% threshold)",
			td.Level, td.Entity, td.Tenant, td.SpentUSD, td.AmountUSD, td.Period, td.Budget, td.Threshold)
	}
	b, _ := json.Marshal(map[string]string{"text": text})
	return b
}

// Delivery is a recorded alert and its delivery state.
type Delivery struct {
	ID          string          `json:"id"`
	Type        string          `json:"type"`
	Status      string          `json:"status"`
	Attempts    int             `json:"attempts"`
	CreatedAt   time.Time       `json:"created_at"`
	DeliveredAt *time.Time      `json:"delivered_at,omitempty"`
	LastError   string          `json:"last_error,omitempty"`
	Event       json.RawMessage `json:"event"`
}

// Alerts lists the recorded alerts, newest first.
func (p *Plane) Alerts(ctx context.Context, limit int) ([]Delivery, error) {
	s := p.store
	if err := s.ensure(ctx); err != nil {
		return nil, err
	}
	rows, err := s.db.QueryContext(ctx, `SELECT idem, type, status, attempts, created_at, delivered_at, last_error, payload
		FROM control_alerts ORDER BY created_at DESC LIMIT `+strconv.Itoa(limit))
	if err != nil {
		return nil, storeErr(err)
	}
	defer rows.Close()
	out := []Delivery{}
	for rows.Next() {
		var (
			d                  Delivery
			created, delivered int64
			payload            string
		)
		if err := rows.Scan(&d.ID, &d.Type, &d.Status, &d.Attempts, &created, &delivered, &d.LastError, &payload); err != nil {
			return nil, storeErr(err)
		}
		d.CreatedAt, d.Event = fromMicros(created), json.RawMessage(payload)
		if delivered > 0 {
			t := fromMicros(delivered)
			d.DeliveredAt = &t
		}
		out = append(out, d)
	}
	return out, storeErr(rows.Err())
}
