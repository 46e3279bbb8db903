package learned

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/costgate/costgate/costmodel/sketch"
)

// FuzzDecodeKey: any Redis key name either decodes to a key that encodes
// back to it, or is an error; never a panic.
func FuzzDecodeKey(f *testing.F) {
	f.Add(chat.encode())
	f.Add(redisPrefix + "a|b|c|0|0|0")
	f.Add(redisPrefix + "a%7C|b|c|1024|1|1")
	f.Add(redisPrefix + "|||||")
	f.Add(redisPrefix + "a|b|c|-1|0|0")
	f.Fuzz(func(t *testing.T, name string) {
		k, err := decodeKey(name)
		if err != nil {
			return
		}
		back, err := decodeKey(k.encode())
		if err != nil || back != k {
			t.Fatalf("%q decodes to %+v, which encodes to %q and decodes to %+v, %v", name, k, k.encode(), back, err)
		}
	})
}

// FuzzParseField: a field is a bucket a Sketch holds, or an error.
func FuzzParseField(f *testing.F) {
	for _, s := range []string{"z", "0", "300", "-1", "99999", "0300", "+1", " 1", "1e3"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		i, err := parseField(s)
		if err != nil {
			return
		}
		var sk sketch.Sketch
		if err := sk.AddBucket(i, 1); err != nil || field(i) != s {
			t.Fatalf("%q parsed as bucket %d: %v, field %q", s, i, err, field(i))
		}
	})
}

// FuzzLoadFile: whatever the file holds, Open succeeds, and every
// estimate it serves is within 0..MaxValue.
func FuzzLoadFile(f *testing.F) {
	f.Add([]byte(`{"version":1,"relative_error":0.01,"keys":[{"tenant":"acme","model":"m","route":"/r","max_tokens":1024,"buckets":[[-1,100],[300,50]]}]}`))
	f.Add([]byte(`{"version":1,"relative_error":0.01,"keys":[{"tenant":"acme","buckets":[[1040,18446744073709551615]]}]}`))
	f.Add([]byte(`{"version":1,"relative_error":0.01,"keys":null}`))
	f.Add([]byte(`{"version":2}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, data []byte) {
		file := filepath.Join(t.TempDir(), "learned.json")
		if err := os.WriteFile(file, data, 0o600); err != nil {
			t.Fatal(err)
		}
		tb, err := Open(context.Background(), Config{File: file, Interval: time.Hour, MinSamples: 1})
		if err != nil {
			t.Fatal(err)
		}
		defer tb.Close()
		tb.each(func(k Key, _ *entry) {
			e := tb.Estimate(k, 0.95)
			if e.Tokens < 0 || e.Tokens > sketch.MaxValue+sketch.MaxValue/50 {
				t.Fatalf("%v: estimate %+v", k, e)
			}
		})
	})
}
