package proxy_test

import (
	"bytes"
	"compress/flate"
	"compress/gzip"
	"compress/zlib"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
)

// encAtkDecoding is an upstream that decodes a request body's content
// codings before it reads it, as Elasticsearch, Apache's DEFLATE input
// filter and many frameworks' middleware do: Content-Encoding in any of
// its spellings (its CGI name, HTTP_CONTENT_ENCODING, is one for
// Content_Encoding too), the codings listed in the order they were
// applied. It then reads the request as unitsAtkLenient does.
func encAtkDecoding(w http.ResponseWriter, r *http.Request) {
	var codings []string
	for k, vs := range r.Header {
		if strings.ToUpper(strings.ReplaceAll(k, "-", "_")) != "CONTENT_ENCODING" {
			continue
		}
		for _, v := range vs {
			for _, c := range strings.Split(v, ",") {
				codings = append(codings, strings.ToLower(strings.TrimSpace(c)))
			}
		}
		delete(r.Header, k)
	}
	b, _ := io.ReadAll(r.Body)
	for i := len(codings) - 1; i >= 0; i-- {
		var rd io.Reader
		var err error
		switch codings[i] {
		case "gzip", "x-gzip":
			rd, err = gzip.NewReader(bytes.NewReader(b))
		case "deflate":
			if rd, err = zlib.NewReader(bytes.NewReader(b)); err != nil {
				rd, err = flate.NewReader(bytes.NewReader(b)), nil // raw deflate, as some clients send it
			}
		case "identity", "":
			continue
		default:
			http.Error(w, "unsupported content coding "+codings[i], http.StatusUnsupportedMediaType)
			return
		}
		if err == nil {
			b, err = io.ReadAll(rd)
		}
		if err != nil {
			http.Error(w, "decoding the body: "+err.Error(), http.StatusBadRequest)
			return
		}
	}
	r.Body = io.NopCloser(bytes.NewReader(b))
	r.ContentLength = int64(len(b))
	unitsAtkLenient(w, r)
}

func encAtkGzip(s string) string {
	var b bytes.Buffer
	zw := gzip.NewWriter(&b)
	zw.Write([]byte(s))
	zw.Close()
	return b.String()
}

func encAtkZlib(s string) string {
	var b bytes.Buffer
	zw := zlib.NewWriter(&b)
	zw.Write([]byte(s))
	zw.Close()
	return b.String()
}

// TestEncodingAttackCompressedBody: a body sent compressed, with a
// Content-Encoding the upstream decodes before it reads the body, is
// priced as the upstream reads it, or refused before it reaches it.
// costgate prices the bytes it reads: a compressed form body held no field
// it could see, so a rule read its default (1 credit) while the upstream
// served the 1,000 the decoded body asked for.
func TestEncodingAttackCompressedBody(t *testing.T) {
	s, up, host := unitsAtkStack(t, encAtkDecoding)
	const form, jsonCT = "application/x-www-form-urlencoded", "application/json"
	multipart := "--XyZ\r\nContent-Disposition: form-data; name=\"credits\"\r\n\r\n1000\r\n--XyZ--\r\n"
	cases := []struct{ name, path, ct, coding, body string }{
		{"gzip form", "/u/credits/run", form, "Content-Encoding: gzip\n", encAtkGzip("credits=1000")},
		{"gzip form to a rule reading the query", "/u/bynum/run?num=1", form, "Content-Encoding: gzip\n", encAtkGzip("num=1000")},
		{"x-gzip form", "/u/credits/run", form, "Content-Encoding: x-gzip\n", encAtkGzip("credits=1000")},
		{"GZIP in upper case", "/u/credits/run", form, "Content-Encoding: GZIP\n", encAtkGzip("credits=1000")},
		{"deflate form", "/u/credits/run", form, "Content-Encoding: deflate\n", encAtkZlib("credits=1000")},
		{"stacked codings", "/u/credits/run", form, "Content-Encoding: deflate, gzip\n", encAtkGzip(encAtkZlib("credits=1000"))},
		{"stacked over two lines", "/u/credits/run", form, "Content-Encoding: deflate\nContent-Encoding: gzip\n", encAtkGzip(encAtkZlib("credits=1000"))},
		{"identity then gzip", "/u/credits/run", form, "Content-Encoding: identity, gzip\n", encAtkGzip("credits=1000")},
		{"Content_Encoding", "/u/credits/run", form, "Content_Encoding: gzip\n", encAtkGzip("credits=1000")},
		{"gzip multipart", "/u/credits/run", "multipart/form-data; boundary=XyZ", "Content-Encoding: gzip\n", encAtkGzip(multipart)},
		{"gzip json", "/u/credits/run", jsonCT, "Content-Encoding: gzip\n", encAtkGzip(`{"credits":1000}`)},
		{"gzip chat completion", "/v1/chat/completions", jsonCT, "Content-Encoding: gzip\n",
			encAtkGzip(`{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}],"max_tokens":4}`)},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			req := fmt.Sprintf("POST %s HTTP/1.1\nHost: %s\nAuthorization: Bearer cg-test-acme\nConnection: close\nContent-Type: %s\n%sContent-Length: %d\n\n%s",
				c.path, host, c.ct, c.coding, len(c.body), c.body)
			unitsAtkBilled(t, s, up, sendRaw(t, s.url, req))
		})
	}
}

// TestEncodingAttackUnreadCodingReachesNothing: a content coding costgate
// does not decode (br, zstd, compress, a name no one knows) is refused
// before the upstream, whose decoder costgate cannot tell: it prices only
// a body it reads as the upstream does.
func TestEncodingAttackUnreadCodingReachesNothing(t *testing.T) {
	s, up, host := unitsAtkStack(t, encAtkDecoding)
	for _, coding := range []string{"br", "zstd", "compress", "aes128gcm", "gzip;q=1"} {
		t.Run(coding, func(t *testing.T) {
			body := "credits=1"
			req := fmt.Sprintf("POST /u/credits/run HTTP/1.1\nHost: %s\nAuthorization: Bearer cg-test-acme\nConnection: close\nContent-Type: application/x-www-form-urlencoded\nContent-Encoding: %s\nContent-Length: %d\n\n%s",
				host, coding, len(body), body)
			got := sendRaw(t, s.url, req)
			if seen := up.take(); got.status != http.StatusBadRequest || len(seen) != 0 {
				t.Errorf("Content-Encoding %s: %d %s; reached the upstream %d times, want 400 and never", coding, got.status, got.body, len(seen))
			}
		})
	}
}
