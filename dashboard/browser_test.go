package dashboard

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"image"
	"image/png"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/costgate/costgate/internal/servicetest"
)

const (
	viewW = 1280
	viewH = 800
	// loaded matches once the page has drawn data.json.
	loaded = chromedp.CSS(`html[data-loaded]`)
)

// browser starts a headless Chromium for the test and returns a context
// for new tabs. Without Chromium the test is Unavailable: it fails under CI
// and skips elsewhere.
func browser(t *testing.T) context.Context {
	t.Helper()
	path := ""
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			path = p
			break
		}
	}
	if path == "" {
		servicetest.Unavailable(t, "chromium is not installed (apt-get install -y chromium)")
	}
	// chromedp's defaults (headless, no first run, no background networking
	// or timer throttling, no sync, ...) and what a container needs.
	opts := append(slices.Clone(chromedp.DefaultExecAllocatorOptions[:]),
		chromedp.ExecPath(path),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(viewW, viewH),
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("no-proxy-server", true),
	)
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	t.Cleanup(cancel)
	actx, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	t.Cleanup(cancelAlloc)
	bctx, cancelBrowser := chromedp.NewContext(actx)
	t.Cleanup(cancelBrowser)
	if _, err := chromedp.Run(bctx, chromedp.Location()); err != nil {
		servicetest.Unavailable(t, "chromium at %s does not start: %v", path, err)
	}
	return bctx
}

// tab opens a new tab in the browser, with a 1280x800 viewport. When the
// test ends, every uncaught exception, console.error and browser error in
// the tab (a Content-Security-Policy violation, for one) fails it; failed
// requests (the 401 and 503 answers that tests provoke) do not.
func tab(t *testing.T, bctx context.Context) context.Context {
	t.Helper()
	ctx, cancel := chromedp.NewContext(bctx)
	t.Cleanup(cancel)
	if err := chromedp.Do(ctx, chromedp.EmulateViewport(viewW, viewH)); err != nil {
		t.Fatalf("open tab: %v", err)
	}
	lctx, stop := context.WithCancel(ctx)
	messages := chromedp.Console(lctx)
	var (
		mu  sync.Mutex
		bad []string
	)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for m, err := range messages {
			if err != nil {
				return
			}
			if m.IsException() || m.Type == chromedp.ConsoleError && m.Source != "network" {
				mu.Lock()
				bad = append(bad, m.String())
				mu.Unlock()
			}
		}
	}()
	t.Cleanup(func() {
		stop()
		<-done
		mu.Lock()
		defer mu.Unlock()
		for _, m := range bad {
			t.Errorf("browser console: %s", m)
		}
	})
	return ctx
}

// do runs the actions, each call within 10 s. On failure it ends the test
// with what the page shows, which usually says why.
func do(t *testing.T, ctx context.Context, what string, actions ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	actx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := chromedp.Do(actx, actions...); err != nil {
		shown, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`document.body.innerText.slice(0, 400)`))
		t.Fatalf("%s: %v\nthe page shows: %q", what, err, shown)
	}
}

// page is what the tests read back from the rendered DOM.
type page struct {
	URL        string              `json:"url"`
	Header     map[string]string   `json:"header"`
	Spend      [][]string          `json:"spend"`
	SpendTitle []string            `json:"spendTitle"`
	Decisions  [][]string          `json:"decisions"`
	Throttled  [][]string          `json:"throttled"`
	Shadow     [][]string          `json:"shadow"`
	HighShadow [][]string          `json:"highShadow"`
	Alert      string              `json:"alert"`
	Charts     []string            `json:"charts"`
	Paths      int                 `json:"paths"`
	Images     int                 `json:"images"`
	Injected   bool                `json:"injected"`
	Empty      map[string]bool     `json:"empty"`
	Login      bool                `json:"login"`
	Tables     map[string]bool     `json:"tables"`
	Extra      map[string][]string `json:"extra"`
	Replay     [][]string          `json:"replay"`
	ReplayText string              `json:"replayText"`
	Limits     [][]string          `json:"limits"`
	RegionText string              `json:"regionText"`
}

const readPage = `(() => {
  // A shortened name keeps its whole text in data-full.
  const rows = (sel) => [...document.querySelectorAll(sel)].map(r => [...r.cells].map(c => c.dataset.full || c.textContent.trim()));
  const shown = (id) => !document.getElementById(id).hidden;
  const text = (id) => document.getElementById(id).textContent.trim();
  return {
    url: location.href,
    header: {kind: text('store-kind'), healthy: text('store-healthy'), breaker: text('store-breaker'), failopen: text('store-failopen'), updated: text('updated')},
    spend: rows('#spend-table tbody tr'),
    spendTitle: [...document.querySelectorAll('#spend-table tbody tr td:nth-child(2)')].map(td => td.title),
    decisions: rows('#decisions-table tbody tr'),
    throttled: rows('#throttled-table tbody tr'),
    shadow: rows('#shadow-table tbody tr'),
    highShadow: rows('#shadow-table tbody tr.high'),
    replay: rows('#replay-table tbody tr'),
    limits: rows('#limits-table tbody tr'),
    regionText: shown('region') ? text('region') : '',
    replayText: shown('replay-summary') ? text('replay-summary') : '',
    alert: shown('shadow-alert') ? text('shadow-alert') : '',
    charts: [...document.querySelectorAll('svg[role=img]')].map(s => s.getAttribute('aria-label') || (s.querySelector('title') || {}).textContent || ''),
    paths: document.querySelectorAll('#spend-chart path.series').length,
    images: document.querySelectorAll('img').length,
    injected: !!document.getElementById('injected'),
    empty: {spend: shown('spend-empty'), decisions: shown('decisions-empty'), throttled: shown('throttled-empty'), shadow: shown('shadow-empty')},
    login: shown('login') && !shown('main') ? true : false,
    tables: {spend: shown('spend-table'), decisions: shown('decisions-table'), throttled: shown('throttled-table'), shadow: shown('shadow-table')},
  };
})()`

func readDOM(t *testing.T, ctx context.Context) page {
	t.Helper()
	p, err := chromedp.Run(ctx, chromedp.Evaluate[page](readPage))
	if err != nil {
		t.Fatalf("read the page: %v", err)
	}
	return p
}

func hasRow(rows [][]string, cells ...string) bool {
	for _, r := range rows {
		if len(r) < len(cells) {
			continue
		}
		ok := true
		for i, c := range cells {
			if c != "" && r[i] != c {
				ok = false
				break
			}
		}
		if ok {
			return true
		}
	}
	return false
}

// TestBrowser loads the dashboard in headless Chromium against realistic
// data, checks what the DOM shows, and checks a 1280x800 screenshot.
func TestBrowser(t *testing.T) {
	bctx := browser(t)

	t.Run("realistic data", func(t *testing.T) {
		t.Parallel() // it waits for a refresh, as "source failure" does
		var calls atomic.Int64
		srv := httptest.NewServer(mount(Handler(func() []string { return []string{testToken} }, func(context.Context) (Data, error) {
			n := calls.Add(1)
			d := sampleData(sampleNow)
			// Each refresh sees a minute later and more fail-open decisions.
			d.GeneratedAt = sampleNow.Add(time.Duration(n-1) * time.Minute)
			d.Store.FailOpenTotal += n - 1
			return d, nil
		})))
		defer srv.Close()
		ctx := tab(t, bctx)
		do(t, ctx, "load the dashboard", chromedp.Navigate(srv.URL+"/admin/#token="+testToken), chromedp.WaitReady(loaded))
		shot, err := chromedp.Run(ctx, chromedp.CaptureScreenshot())
		if err != nil {
			t.Fatalf("screenshot: %v", err)
		}
		p := readDOM(t, ctx)
		checkRealistic(t, p)
		checkScreenshot(t, shot)

		// Auto-refresh: the page fetches again within 5 s and shows the
		// new data without a reload.
		refreshed := chromedp.Poll[bool](`document.getElementById('store-failopen').textContent === '1,743'`,
			chromedp.WithPollingTimeout(9*time.Second), chromedp.WithPollingInterval(100*time.Millisecond))
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		if _, err := chromedp.Run(rctx, refreshed); err != nil {
			t.Fatalf("the page did not refresh within 9 s (%d fetches): %v", calls.Load(), err)
		}
		if p := readDOM(t, ctx); !strings.Contains(p.Header["updated"], "10:46:30") {
			t.Errorf("after refresh the header says %q, want the new time 10:46:30", p.Header["updated"])
		}
	})

	t.Run("source failure", func(t *testing.T) {
		t.Parallel()
		var n atomic.Int64
		flaky := httptest.NewServer(mount(Handler(func() []string { return []string{testToken} }, func(context.Context) (Data, error) {
			if n.Add(1) == 1 {
				return sampleData(sampleNow), nil
			}
			return Data{}, errors.New("telemetry store unreachable")
		})))
		defer flaky.Close()
		ctx := tab(t, bctx)
		do(t, ctx, "load", chromedp.Navigate(flaky.URL+"/admin/#token="+testToken), chromedp.WaitReady(loaded))
		// The next refresh fails: the page says why and keeps the last data.
		do(t, ctx, "wait for the error of a failed refresh", chromedp.WaitVisible(chromedp.ID("error")))
		msg, err := chromedp.Run(ctx, chromedp.Text(chromedp.ID("error")))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(msg, "telemetry store unreachable") || !strings.Contains(msg, "last data") {
			t.Errorf("error banner = %q", msg)
		}
		if p := readDOM(t, ctx); p.Login || !hasRow(p.Throttled, "1", topKey) {
			t.Errorf("the last data is gone after a failed refresh: login %v, throttled %v", p.Login, p.Throttled)
		}
	})

	t.Run("long names keep their start", func(t *testing.T) {
		t.Parallel()
		const limit = "enterprise-tier-output-tokens-per-minute-eu-west"
		const policy = "limit " + limit
		long := httptest.NewServer(mount(Handler(func() []string { return []string{testToken} }, func(context.Context) (Data, error) {
			d := Data{GeneratedAt: sampleNow, Store: StoreHealth{Kind: "memory", Healthy: true, Breaker: "closed"}}
			d.Decisions = []PolicyDecisions{{Policy: policy, Hard: 7, Points: []CountPoint{{T: sampleNow.Add(-time.Minute), Count: 7}}}}
			d.TopThrottled = []Throttled{{Key: "{acme}:tenant=acme", Limit: limit, Tenant: "acme", Count: 7}}
			return d, nil
		})))
		defer long.Close()
		ctx := tab(t, bctx)
		do(t, ctx, "load", chromedp.Navigate(long.URL+"/admin/#token="+testToken), chromedp.WaitReady(loaded))
		type cell struct{ Text, Full string }
		cells, err := chromedp.Run(ctx, chromedp.Evaluate[[]cell](`[...document.querySelectorAll('#decisions-table tbody th.name, #throttled-table tbody td.name, #decisions-chart text.label')].map(c => ({text: c.firstChild ? c.firstChild.textContent : '', full: (c.dataset && c.dataset.full) || ''}))`))
		if err != nil {
			t.Fatal(err)
		}
		var sawLimit, sawPolicy bool
		for _, c := range cells {
			full := c.Full
			if full == "" {
				full = c.Text
			}
			if full != limit && full != policy && !strings.Contains(c.Text, "…") {
				continue
			}
			if strings.Contains(c.Text, "…") {
				if !strings.HasPrefix(full, strings.SplitN(c.Text, "…", 2)[0]) || len(strings.SplitN(c.Text, "…", 2)[0]) < 8 {
					t.Errorf("%q is shown as %q: its start is cut", full, c.Text)
				}
			}
			sawLimit = sawLimit || strings.HasPrefix(c.Text, "enterprise-t")
			sawPolicy = sawPolicy || strings.HasPrefix(c.Text, "limit enterprise")
		}
		if !sawLimit || !sawPolicy {
			t.Errorf("the long limit's name is not shown from its start in both tables: %+v", cells)
		}
	})

	t.Run("empty data", func(t *testing.T) {
		empty := httptest.NewServer(mount(Handler(func() []string { return []string{testToken} }, func(context.Context) (Data, error) {
			return Data{GeneratedAt: sampleNow, Store: StoreHealth{Kind: "memory", Healthy: true, Breaker: "closed"}}, nil
		})))
		defer empty.Close()
		ctx := tab(t, bctx)
		do(t, ctx, "load", chromedp.Navigate(empty.URL+"/admin/#token="+testToken), chromedp.WaitReady(loaded))
		p := readDOM(t, ctx)
		for _, k := range []string{"spend", "decisions", "throttled", "shadow"} {
			if !p.Empty[k] || p.Tables[k] {
				t.Errorf("%s: empty state shown %v, table shown %v; want the empty state only", k, p.Empty[k], p.Tables[k])
			}
		}
		if p.Header["kind"] != "memory" || p.Header["breaker"] != "closed" || p.Header["failopen"] != "0" {
			t.Errorf("header = %v", p.Header)
		}
	})

	t.Run("many tenants and keys", func(t *testing.T) {
		srv := httptest.NewServer(mount(Handler(func() []string { return []string{testToken} }, func(context.Context) (Data, error) {
			d := sampleData(sampleNow)
			for i := range 9 {
				d.Spend = append(d.Spend, TenantSeries{Tenant: fmt.Sprintf("tenant-%02d", i), Points: []Point{{T: sampleNow, NanoUSD: int64(i+1) * 1_000}}})
			}
			for i := range 30 {
				d.TopThrottled = append(d.TopThrottled, Throttled{Key: fmt.Sprintf("tenant:acme|user:u%02d", i), Limit: "pro-requests", Tenant: "acme", Count: int64(i + 1)})
			}
			return d, nil
		})))
		defer srv.Close()
		ctx := tab(t, bctx)
		do(t, ctx, "load", chromedp.Navigate(srv.URL+"/admin/#token="+testToken), chromedp.WaitReady(loaded))
		p := readDOM(t, ctx)
		// Six tenants drawn by name, the other six summed; 20 keys and a note.
		if len(p.Spend) != 7 || p.Paths != 7 || p.Spend[6][0] != "6 other tenants" || p.Spend[0][0] != "globex" {
			t.Errorf("spend rows %v with %d lines, want the 6 biggest and \"6 other tenants\"", p.Spend, p.Paths)
		}
		if len(p.Throttled) != 21 || p.Throttled[20][0] != "… and 14 more not shown" || !hasRow(p.Throttled[:1], "1", topKey) {
			t.Errorf("throttled rows: %d, last %v; want 20 and a note of 14 more", len(p.Throttled), p.Throttled[len(p.Throttled)-1])
		}
	})

	t.Run("login form", func(t *testing.T) {
		srv := httptest.NewServer(mount(Handler(func() []string { return []string{testToken} }, func(context.Context) (Data, error) {
			return sampleData(sampleNow), nil
		})))
		defer srv.Close()
		ctx := tab(t, bctx)
		// A wrong token in the fragment brings up the login form.
		do(t, ctx, "wait for the login form after a wrong token",
			chromedp.Navigate(srv.URL+"/admin/#token=wrong"), chromedp.WaitVisible(chromedp.ID("login")))
		reason, err := chromedp.Run(ctx, chromedp.Text(chromedp.ID("login-reason")))
		if err != nil {
			t.Fatal(err)
		}
		do(t, ctx, "sign in through the form",
			chromedp.SendKeys(chromedp.ID("token-input"), testToken),
			chromedp.Click(chromedp.CSS(`#login button[type=submit]`)),
			chromedp.WaitReady(loaded))
		if !strings.Contains(reason, "not accepted") {
			t.Errorf("login reason = %q, want it to say the token was not accepted", reason)
		}
		p := readDOM(t, ctx)
		if p.Login || !hasRow(p.Throttled, "1", topKey) {
			t.Errorf("after signing in: login shown %v, throttled %v", p.Login, p.Throttled)
		}
	})
}

func checkRealistic(t *testing.T, p page) {
	t.Helper()
	d := sampleData(sampleNow)

	if strings.Contains(p.URL, "token") {
		t.Errorf("the token stays in the address bar: %s", p.URL)
	}
	if len(p.Limits) != 3 || !reflect.DeepEqual(p.Limits[0], []string{"global-tokens", "leased", "2", "3", "4,200"}) || !hasRow(p.Limits, "daily", "strict budget") {
		t.Errorf("limits rows %q, want global-tokens (leased, 2 keys, 3 leases, 4,200 unspent) first, and the daily budget", p.Limits)
	}
	if want := "Region eu of eu, us: last reconciliation 2026-11-30T10:45:25.000Z; last error: dial tcp: connection refused"; p.RegionText != want {
		t.Errorf("region %q, want %q", p.RegionText, want)
	}
	if want := "Candidate plans.rego, run 2026-11-30T10:35:30.000Z: 312 of 12,480 captured requests over the last 24h would be decided otherwise ($4.21 of estimated spend)."; p.ReplayText != want {
		t.Errorf("replay summary %q, want %q", p.ReplayText, want)
	}
	if len(p.Replay) != 4 || !hasRow(p.Replay, "change", "allow->hard", "300", "$4.00") || !hasRow(p.Replay, "tenant", shadowTenant, "312", "$4.21") {
		t.Errorf("replay rows %q, want the 2 changes, the policy and the tenant", p.Replay)
	}
	wantHeader := map[string]string{"kind": "redis", "healthy": "healthy", "breaker": "half-open", "failopen": "1,742", "updated": "Data at 10:45:30 UTC"}
	for k, v := range wantHeader {
		if p.Header[k] != v {
			t.Errorf("header %s = %q, want %q", k, p.Header[k], v)
		}
	}

	// Spend: every tenant, most spent first, with the hour's total to the
	// cent and, in the cell's title, to the nano-dollar.
	if len(p.Spend) != 3 || p.Paths != 3 {
		t.Fatalf("spend rows %v, %d lines; want 3 tenants", p.Spend, p.Paths)
	}
	for i, tenant := range []string{"globex", "acme", "initech"} {
		var total int64
		for _, s := range d.Spend {
			if s.Tenant == tenant {
				total = sumSpend(s.Points)
			}
		}
		if p.Spend[i][0] != tenant || p.Spend[i][1] != formatMoney(total) {
			t.Errorf("spend row %d = %v, want %s %s", i, p.Spend[i], tenant, formatMoney(total))
		}
		if p.SpendTitle[i] != formatUSD(total, 9) {
			t.Errorf("spend row %d exact total = %q, want %q", i, p.SpendTitle[i], formatUSD(total, 9))
		}
	}

	// Decisions: a row per policy with its counts, most blocked first.
	if len(p.Decisions) != 4 {
		t.Fatalf("decision rows: %v", p.Decisions)
	}
	for _, pd := range d.Decisions {
		n := func(v int64) string { return commas(v) }
		if !hasRow(p.Decisions, pd.Policy, n(pd.Allow), n(pd.Soft), n(pd.Hard), n(pd.Shadow)) {
			t.Errorf("no decision row for %s %d/%d/%d/%d in %v", pd.Policy, pd.Allow, pd.Soft, pd.Hard, pd.Shadow, p.Decisions)
		}
	}
	if p.Decisions[0][0] != "costgate.policies.plans" {
		t.Errorf("first decision row %v, want the most blocked policy first", p.Decisions[0])
	}

	// Top throttled: the most blocked key first; markup in a key is text.
	if !hasRow(p.Throttled, "1", topKey, "free-requests", "globex", "1,204") {
		t.Errorf("top throttled rows %v, want %s first", p.Throttled, topKey)
	}
	if !hasRow(p.Throttled, "4", markupKey) || p.Images != 0 || p.Injected {
		t.Errorf("a key with markup was not shown as text: rows %v, %d img elements", p.Throttled, p.Images)
	}

	// Shadow: the 40% row first, highlighted, and called out above the table.
	if len(p.Shadow) != 2 || !hasRow(p.Shadow[:1], shadowPolicy, shadowLimit, shadowTenant, "5,312") ||
		!strings.HasPrefix(p.Shadow[0][4], "40.0%") {
		t.Errorf("shadow rows %v, want %s at 40.0%% first", p.Shadow, shadowTenant)
	}
	if len(p.HighShadow) != 1 || p.HighShadow[0][2] != shadowTenant {
		t.Errorf("highlighted shadow rows %v, want only %s", p.HighShadow, shadowTenant)
	}
	if !strings.Contains(p.Alert, "40.0%") || !strings.Contains(p.Alert, shadowTenant) || !strings.Contains(p.Alert, shadowPolicy) {
		t.Errorf("shadow call-out = %q", p.Alert)
	}

	// Charts are labelled images: spend, decisions and a sparkline a policy.
	if len(p.Charts) != 2+len(d.Decisions) {
		t.Errorf("labelled charts: %q", p.Charts)
	}
	for _, c := range p.Charts {
		if c == "" {
			t.Errorf("a chart has no label: %q", p.Charts)
		}
	}
}

func commas(v int64) string {
	s := fmt.Sprint(v)
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}

// checkScreenshot checks that the screenshot is a 1280x800 PNG that shows
// something: many colours, the dark header at the top, the light page below.
// It writes it to $COSTGATE_SCREENSHOT when set, else to the test's
// temporary directory.
func checkScreenshot(t *testing.T, shot []byte) {
	t.Helper()
	out := os.Getenv("COSTGATE_SCREENSHOT")
	if out == "" {
		out = filepath.Join(t.TempDir(), "dashboard.png")
	}
	if err := os.WriteFile(out, shot, 0o644); err != nil {
		t.Errorf("write screenshot: %v", err)
	}
	t.Logf("screenshot: %s", out)

	img, err := png.Decode(bytes.NewReader(shot))
	if err != nil {
		t.Fatalf("the screenshot is not a PNG: %v", err)
	}
	if b := img.Bounds(); b.Dx() != viewW || b.Dy() != viewH {
		t.Fatalf("screenshot is %dx%d, want %dx%d", b.Dx(), b.Dy(), viewW, viewH)
	}
	colours := map[uint32]bool{}
	for y := 0; y < viewH; y += 2 {
		for x := 0; x < viewW; x += 2 {
			r, g, b, _ := img.At(x, y).RGBA()
			colours[r>>8<<16|g>>8<<8|b>>8] = true
		}
	}
	if len(colours) < 50 {
		t.Errorf("the screenshot has %d colours; a rendered dashboard has many", len(colours))
	}
	if l := luma(img, 8, 8); l > 80 {
		t.Errorf("the header is not dark (luma %d): the stylesheet did not apply", l)
	}
	if l := luma(img, 4, viewH-4); l < 200 {
		t.Errorf("the page background is not light (luma %d)", l)
	}
}

func luma(img image.Image, x, y int) int {
	r, g, b, _ := img.At(x, y).RGBA()
	return int((299*(r>>8) + 587*(g>>8) + 114*(b>>8)) / 1000)
}
