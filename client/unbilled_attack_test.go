package client_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/costgate/costgate/client"
	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/ledger"
)

// TestUnbilledAtkTransportErrorsRedirectsAndRereads: three answers a
// metered API gives that are not a plain 200.
//
//   - A 500 that reports units (the API says what it spent on the error)
//     is settled as failed at $0, as the proxy charges a generic
//     upstream's error, and the caller reads the error body whole.
//   - A POST answered 303 See Other is followed by http.Client as a GET
//     without the body: each hop is reserved and settled once, the 303
//     at its estimate (it reports nothing, as the proxy would charge it),
//     the GET by the units it reports; nothing is left held.
//   - The caller reads the body the Transport buffered twice: the second
//     read is at its end, Close twice is harmless, and nothing is settled
//     again.
func TestUnbilledAtkTransportErrorsRedirectsAndRereads(t *testing.T) {
	s := newStack(t, "memory", "", nil)
	api, calls := meteredStub(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		switch r.URL.Path {
		case "/fail":
			w.Header().Set("X-Units", "7")
			w.WriteHeader(http.StatusInternalServerError)
			io.WriteString(w, `{"error":"boom","units_used":7}`)
		case "/post":
			w.Header().Set("Location", "/final?count=2")
			w.WriteHeader(http.StatusSeeOther)
		case "/final":
			if r.Method != http.MethodGet {
				http.Error(w, "want GET", http.StatusMethodNotAllowed)
				return
			}
			io.WriteString(w, `{"units_used":3}`)
		}
	})
	var ends attackEnds
	hc := &http.Client{Transport: &client.Transport{Client: s.client("cg-test-acme"), Rule: creditsRule, Settled: ends.hook}}

	resp, err := hc.Get(api + "/fail?count=5")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 500 || string(body) != `{"error":"boom","units_used":7}` {
		t.Fatalf("the caller read %d %q", resp.StatusCode, body)
	}
	n, sts, errs := ends.snapshot()
	if n != 1 || errs[0] != nil || sts[0] == nil {
		t.Fatalf("Settled %d times: %v", n, errs)
	}
	if e := s.entry(t, "acme", sts[0].RequestID, final); e.Status != ledger.StatusFailed || e.ActualCost != 0 {
		t.Errorf("a 500 reporting 7 units: ledger %s %v, want failed at $0", e.Status, e.ActualCost)
	}

	resp, err = hc.Post(api+"/post?count=6", "application/json", bytes.NewReader([]byte(`{"count":6}`)))
	if err != nil {
		t.Fatal(err)
	}
	body, _ = io.ReadAll(resp.Body)
	if string(body) != `{"units_used":3}` || calls.Load() != 3 {
		t.Fatalf("caller read %q after %d calls", body, calls.Load())
	}
	// The body read twice: at its end, no error; Close twice.
	if m, err := resp.Body.Read(make([]byte, 8)); m != 0 || err != io.EOF {
		t.Errorf("a second read: %d, %v; want 0, EOF", m, err)
	}
	if err := resp.Body.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if err := resp.Body.Close(); err != nil {
		t.Errorf("Close again: %v", err)
	}
	n, sts, errs = ends.snapshot()
	if n != 3 || errs[1] != nil || errs[2] != nil {
		t.Fatalf("Settled %d times: %v", n, errs)
	}
	for i, want := range map[int]int64{1: 6, 2: 3} {
		e := s.entry(t, "acme", sts[i].RequestID, final)
		if e.Status != ledger.StatusSettled || e.Actual.Units != want || e.ActualCost != creditsCost(want) {
			t.Errorf("hop %d: ledger %s %d units %v, want settled %d units %v", i, e.Status, e.Actual.Units, e.ActualCost, want, creditsCost(want))
		}
	}
	for _, e := range waitFinal(t, s) {
		if !e.Status.Final() {
			t.Errorf("entry %s left %s", e.RequestID, e.Status)
		}
	}
}

// TestUnbilledAtkSilentCallBillsTheActualMax: the API has the request and
// never answers before the caller gives up (a slow render that it runs
// and bills all the same). A rule that reads the units from the answer
// caps them at Actual.Max: the call is charged that, as the proxy charges
// a generic upstream's request that got no answer in time, not the
// estimate a tenant could keep low by asking for little.
func TestUnbilledAtkSilentCallBillsTheActualMax(t *testing.T) {
	s := newStack(t, "memory", "", nil)
	release := make(chan struct{})
	defer close(release)
	api, _ := meteredStub(t, func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-release:
		}
	})
	rule := creditsRuleUpTo(30)
	var ends attackEnds
	hc := &http.Client{Transport: &client.Transport{Client: s.client("cg-test-acme"), Rule: rule, Settled: ends.hook}}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", api+"/silent?count=2", nil)
	if resp, err := hc.Do(req); err == nil {
		resp.Body.Close()
		t.Fatal("no error from a call with no answer")
	}
	n, sts, errs := ends.snapshot()
	if n != 1 || errs[0] != nil || sts[0] == nil {
		t.Fatalf("Settled %d times, settlement %v, error %v", n, sts, errs)
	}
	e := s.entry(t, "acme", sts[0].RequestID, final)
	if e.Actual.Units != 30 || e.ActualCost != creditsCost(30) {
		t.Errorf("ledger %d units %v for a call with no answer, want its actual's max, 30 (%v)", e.Actual.Units, e.ActualCost, creditsCost(30))
	}
}

// TestUnbilledAtkUnreadableReportBillsTheActualMax: the API answers with
// a report costgate cannot read: its field in two spellings (a decoder
// that folds case keeps the larger one) or not a count. It is charged the
// most the rule lets the answer report, as the proxy charges it, not the
// estimate a tenant keeps low by asking for little.
func TestUnbilledAtkUnreadableReportBillsTheActualMax(t *testing.T) {
	s := newStack(t, "memory", "", nil)
	bodies := []string{`{"units_used":1,"Units_Used":40}`, `{"units_used":1,"units_used":40}`, `{"units_used":"forty"}`}
	api, _ := meteredStub(t, func(w http.ResponseWriter, r *http.Request) {
		i, _ := strconv.Atoi(r.URL.Query().Get("i"))
		io.WriteString(w, bodies[i])
	})
	rule := creditsRuleUpTo(30)
	var ends attackEnds
	hc := &http.Client{Transport: &client.Transport{Client: s.client("cg-test-acme"), Rule: rule, Settled: ends.hook}}
	for i, body := range bodies {
		resp, err := hc.Get(fmt.Sprintf("%s/x?count=2&i=%d", api, i))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		n, sts, errs := ends.snapshot()
		if n != i+1 || errs[i] != nil || sts[i] == nil {
			t.Fatalf("%s: Settled %d times, %v", body, n, errs)
		}
		e := s.entry(t, "acme", sts[i].RequestID, final)
		if e.Actual.Units != 30 || e.ActualCost != creditsCost(30) {
			t.Errorf("%s: ledger %d units %v, want its actual's max, 30 (%v)", body, e.Actual.Units, e.ActualCost, creditsCost(30))
		}
	}
}

// creditsRuleUpTo is creditsRule with its answer's report capped at max
// (Actual.Max): what a call whose report is unread is charged.
func creditsRuleUpTo(max int64) costmodel.Rule {
	rule := creditsRule
	actual := *creditsRule.Actual
	actual.Max = max
	rule.Actual = &actual
	return rule
}
