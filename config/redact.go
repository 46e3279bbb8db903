package config

import (
	"errors"
	"net/url"
	"strconv"
	"strings"
)

// redacted stands for a secret in a URL that is printed or logged.
const redacted = "xxxxx"

// RedactURL returns s, a URL from the configuration or the wire, fit to
// print or log: its userinfo (user and password) and every query value are
// replaced by "xxxxx". A string that does not parse as a URL loses
// everything up to its last "@" after the scheme, and its query.
func RedactURL(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		scheme, rest, ok := strings.Cut(s, "://")
		if !ok {
			scheme, rest = "", s
		}
		if i := strings.LastIndexByte(rest, '@'); i >= 0 {
			rest = redacted + rest[i:]
		}
		if i := strings.IndexByte(rest, '?'); i >= 0 {
			rest = rest[:i+1] + redacted
		}
		if ok {
			return scheme + "://" + rest
		}
		return rest
	}
	if u.User != nil {
		u.User = url.User(redacted)
	}
	if u.RawQuery != "" {
		q := u.Query()
		for k := range q {
			q[k] = []string{redacted}
		}
		u.RawQuery = q.Encode()
	}
	if u.Opaque != "" && strings.ContainsRune(u.Opaque, '@') {
		// mailto-like or a "host:port" mistaken for a scheme: keep nothing
		// that may be a secret.
		u.Opaque = redacted
	}
	return u.String()
}

// RedactErr returns err with the URL of the *url.Error in its chain
// redacted in its message (a transport error names the URL it called,
// query credential included; a parse error names the URL it could not
// parse). The result unwraps to err.
func RedactErr(err error) error {
	var ue *url.Error
	if err == nil || !errors.As(err, &ue) || ue.URL == "" {
		return err
	}
	safe := RedactURL(ue.URL)
	msg := strings.ReplaceAll(err.Error(), strconv.Quote(ue.URL), strconv.Quote(safe))
	msg = strings.ReplaceAll(msg, ue.URL, safe)
	return &redactedError{msg: msg, err: err}
}

// redactedError is an error whose message has had its secrets taken out.
type redactedError struct {
	msg string
	err error
}

func (e *redactedError) Error() string { return e.msg }
func (e *redactedError) Unwrap() error { return e.err }
