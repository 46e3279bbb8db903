package proxy_test

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
)

// TestIsolationAttackMethodOverrideParameter: a POST whose form body or
// query names another method in _method (Rails' Rack::MethodOverride,
// Laravel and Symfony, Express's method-override) has the upstream run
// that method: a DELETE through an upstream whose methods are GET and
// POST, under costgate's credential. It is refused, as the header is.
func TestIsolationAttackMethodOverrideParameter(t *testing.T) {
	gen, s, host := isoGenericStack(t, "search", "    methods: [GET, POST]\n")
	multipart := "--XyZ\r\nContent-Disposition: form-data; name=\"_method\"\r\n\r\nDELETE\r\n--XyZ--\r\n"
	cases := []struct{ name, target, ct, body string }{
		{"form field", "/u/search/index/doc-1", "application/x-www-form-urlencoded", "_method=DELETE"},
		{"form field in another case", "/u/search/index/doc-1", "application/x-www-form-urlencoded", "a=1&_METHOD=delete"},
		{"form field escaped", "/u/search/index/doc-1", "application/x-www-form-urlencoded", "%5Fmethod=DELETE"},
		{"multipart field", "/u/search/index/doc-1", "multipart/form-data; boundary=XyZ", multipart},
		{"query parameter", "/u/search/index/doc-1?_method=DELETE", "application/json", "{}"},
		{"query parameter in another case", "/u/search/index/doc-1?_Method=DELETE", "application/json", "{}"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := sendRaw(t, s.url, fmt.Sprintf("POST %s HTTP/1.1\nHost: %s\nAuthorization: Bearer cg-test-acme\nContent-Type: %s\nContent-Length: %d\nConnection: close\n\n%s",
				c.target, host, c.ct, len(c.body), c.body))
			for _, seen := range gen.take() {
				q, _ := url.ParseQuery(seen.rawQuery)
				form, _ := url.ParseQuery(seen.body)
				for k := range q {
					if strings.EqualFold(k, "_method") {
						t.Errorf("the upstream was asked (%d) by the query's %s to run another method than POST", got.status, k)
					}
				}
				for k := range form {
					if strings.EqualFold(k, "_method") {
						t.Errorf("the upstream was asked (%d) by the form's %s to run another method than POST", got.status, k)
					}
				}
				if strings.Contains(seen.body, `name="_method"`) {
					t.Errorf("the upstream was asked (%d) by a multipart _method to run another method than POST", got.status)
				}
			}
		})
	}
	// Spellings PHP (Laravel, Symfony) reads as _method: a '.' for the
	// '_', a leading space, a NUL cutting the name; and a field after a
	// ';', which Rack before 3 takes for '&'. Each is refused before the
	// upstream.
	for _, body := range []string{".method=DELETE", "+_method=DELETE", "_method%00x=DELETE", "a=1;_method=DELETE"} {
		t.Run("form "+body, func(t *testing.T) {
			got := sendRaw(t, s.url, fmt.Sprintf("POST /u/search/index/doc-1 HTTP/1.1\nHost: %s\nAuthorization: Bearer cg-test-acme\nContent-Type: application/x-www-form-urlencoded\nContent-Length: %d\nConnection: close\n\n%s",
				host, len(body), body))
			if n := len(gen.take()); got.status != http.StatusBadRequest || n != 0 {
				t.Errorf("%d %s, reached the upstream %d times; want 400 method_override", got.status, got.body, n)
			}
		})
	}
	// A plain POST, and a _method that names no other method than POST's
	// own spelling in a field of another name, still pass.
	got := sendRaw(t, s.url, "POST /u/search/index/doc-1 HTTP/1.1\nHost: "+host+"\nAuthorization: Bearer cg-test-acme\nContent-Type: application/x-www-form-urlencoded\nContent-Length: 12\nConnection: close\n\nmethod=GET&a")
	if got.status != http.StatusOK || len(gen.take()) != 1 {
		t.Errorf("a plain form POST: %d %s", got.status, got.body)
	}
}
