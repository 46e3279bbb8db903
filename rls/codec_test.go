package rls

import (
	"bytes"
	"errors"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"testing"
	"time"
	"unicode/utf8"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// descOf is a descriptor of the entries key1, value1, key2, value2...
func descOf(kv ...string) *commonv3.RateLimitDescriptor {
	dd := &commonv3.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		dd.Entries = append(dd.Entries, &commonv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return dd
}

// codecSeeds are requests of every shape decodeRequest reads and of some
// it leaves to proto.Unmarshal, in the wire format.
func codecSeeds(t testing.TB) [][]byte {
	t.Helper()
	reqs := []*rlsv3.RateLimitRequest{
		{},
		{Domain: "costgate", HitsAddend: 1, Descriptors: []*commonv3.RateLimitDescriptor{descOf("tenant", "bench-1")}},
		{Domain: "costgate", Descriptors: []*commonv3.RateLimitDescriptor{
			descOf("tenant", "bench-1"), descOf("tenant", "bench-1", "generic_key", "search"), descOf("remote_address", "10.0.0.1"),
		}},
		{Domain: "d", Descriptors: []*commonv3.RateLimitDescriptor{
			{Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: "tokens"}}, HitsAddend: wrapperspb.UInt64(math.MaxUint64), IsNegativeHits: true},
			{},
			{HitsAddend: &wrapperspb.UInt64Value{}},
		}},
		{Domain: "d", Descriptors: []*commonv3.RateLimitDescriptor{{
			Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: "k", Value: "v"}},
			Limit:   &commonv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 3, Unit: typev3.RateLimitUnit_MINUTE, UnitMultiplier: wrapperspb.UInt32(2)},
		}}},
	}
	var seeds [][]byte
	for _, r := range reqs {
		b, err := proto.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		seeds = append(seeds, b)
	}
	ok := seeds[1]
	seeds = append(seeds,
		append(bytes.Clone(ok), 0x78, 0x01),                                                 // unknown field 15
		append(bytes.Clone(ok), 0x1a, 0x00),                                                 // hits_addend of the wrong wire type
		append(bytes.Clone(ok), 0x0a, 0x02, 0xff, 0xfe),                                     // domain not UTF-8
		append(bytes.Clone(ok), 0x12, 0x06, 0x0a, 0x04, 0x12, 0x02, 0xc3, 0x28),             // value not UTF-8
		append(bytes.Clone(ok), 0x12, 0x08, 0x1a, 0x02, 0x08, 0x05, 0x1a, 0x02, 0x10, 0x01), // hits_addend twice, merged
		append(bytes.Clone(ok), 0x12, 0x04, 0x0a, 0x02, 0x1b, 0x1c),                         // a group inside an entry
		[]byte{0x00},             // field 0
		[]byte{0x0a, 0x05, 0x61}, // truncated
		[]byte{0x18, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02}, // varint overflow
		[]byte{0x18, 0x80, 0x80, 0x80, 0x80, 0x10},                               // hits_addend above 2^32
	)
	return seeds
}

// FuzzRequestCodec checks the codec against the generated code on
// arbitrary bytes: it accepts and refuses what proto.Unmarshal does, and
// reads the same message.
func FuzzRequestCodec(f *testing.F) {
	for _, b := range codecSeeds(f) {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		checkRequestCodec(t, b)
	})
}

func checkRequestCodec(t *testing.T, b []byte) {
	t.Helper()
	want := &rlsv3.RateLimitRequest{}
	wantErr := proto.Unmarshal(b, want)
	if outOfBounds(b) {
		checkShape(t, b, want, wantErr)
		return
	}
	// An entry's key or value that is not UTF-8 is read as its bytes,
	// where proto.Unmarshal refuses the request: the codec's reading, each
	// such byte '?', is what proto.Unmarshal reads with them so.
	notUTF8 := false
	if valid, ok := validEntries(b); ok && wantErr != nil {
		if w := (&rlsv3.RateLimitRequest{}); proto.Unmarshal(valid, w) == nil {
			want, wantErr, notUTF8 = w, nil, true
		}
	}
	same := func(got *rlsv3.RateLimitRequest) bool {
		if notUTF8 {
			got = proto.Clone(got).(*rlsv3.RateLimitRequest)
			for _, dd := range got.Descriptors {
				for _, en := range dd.Entries {
					en.Key, en.Value = questioned(en.Key), questioned(en.Value)
				}
			}
		}
		return proto.Equal(got, want)
	}
	fast := &rlsv3.RateLimitRequest{}
	if decodeRequest(b, fast) {
		if wantErr != nil {
			t.Fatalf("decodeRequest read %x, which proto.Unmarshal refuses: %v", b, wantErr)
		}
		if !same(fast) {
			t.Fatalf("decodeRequest read %x as %v, proto.Unmarshal as %v", b, fast, want)
		}
	}
	got := &rlsv3.RateLimitRequest{}
	err := newCodec().Unmarshal(mem.BufferSlice{mem.SliceBuffer(b)}, got)
	if (err == nil) != (wantErr == nil) {
		t.Fatalf("codec: %v, proto.Unmarshal: %v, on %x", err, wantErr, b)
	}
	if err == nil && !same(got) {
		t.Fatalf("codec read %x as %v, proto.Unmarshal as %v", b, got, want)
	}
}

// questioned is s with each byte that is not UTF-8 '?'.
func questioned(s string) string {
	b := []byte(s)
	for i := 0; i < len(b); {
		r, n := utf8.DecodeRune(b[i:])
		if r == utf8.RuneError && n == 1 {
			b[i] = '?'
		}
		i += n
	}
	return string(b)
}

// TestRequestCodecEntriesNotUTF8: an entry's key and value that are not
// UTF-8 are read as their bytes, by decodeRequest and by the fallback of a
// request it leaves to proto.Unmarshal (a limit override); the last of
// each wins, as in proto.Unmarshal; a domain that is not UTF-8 is still
// refused.
func TestRequestCodecEntriesNotUTF8(t *testing.T) {
	entry := func(fields ...string) []byte { // key, value, key, value...
		var e []byte
		for i, f := range fields {
			e = protowire.AppendTag(e, protowire.Number(1+i%2), protowire.BytesType)
			e = protowire.AppendString(e, f)
		}
		return e
	}
	desc := func(override bool, entries ...[]byte) []byte {
		var d []byte
		for _, e := range entries {
			d = protowire.AppendTag(d, 1, protowire.BytesType)
			d = protowire.AppendBytes(d, e)
		}
		if override {
			d = protowire.AppendTag(d, 2, protowire.BytesType)
			d = protowire.AppendBytes(d, []byte{0x08, 0x05, 0x10, 0x02}) // 5 a minute
		}
		return d
	}
	request := func(domain string, descs ...[]byte) []byte {
		b := protowire.AppendTag(nil, 1, protowire.BytesType)
		b = protowire.AppendString(b, domain)
		for _, d := range descs {
			b = protowire.AppendTag(b, 2, protowire.BytesType)
			b = protowire.AppendBytes(b, d)
		}
		return b
	}
	for _, override := range []bool{false, true} {
		b := request("d",
			desc(false, entry("user", "a\xff")),
			desc(override, entry("k", "ok"), entry("k\xc3", "first\x80", "k\xc3(", "last\xed\xa0\x80")),
		)
		checkRequestCodec(t, b)
		var req rlsv3.RateLimitRequest
		if err := unmarshalRequest(b, &req); err != nil {
			t.Fatalf("override %v: %v", override, err)
		}
		got := []string{}
		for _, dd := range req.Descriptors {
			for _, en := range dd.Entries {
				got = append(got, en.Key, en.Value)
			}
		}
		if want := []string{"user", "a\xff", "k", "ok", "k\xc3(", "last\xed\xa0\x80"}; !slices.Equal(got, want) {
			t.Errorf("override %v: entries %q, want %q", override, got, want)
		}
		if (req.Descriptors[1].Limit != nil) != override {
			t.Errorf("override %v: limit %v", override, req.Descriptors[1].Limit)
		}
	}
	var req rlsv3.RateLimitRequest
	if err := unmarshalRequest(request("d\xff", desc(false, entry("k", "v\xff"))), &req); err == nil {
		t.Errorf("a domain not UTF-8 read as %q", req.Domain)
	}
}

// checkShape checks the codec on b, a request past the bounds: it reads
// the domain, the number of descriptors and, when they are within the
// bounds, the number of entries of each, as proto.Unmarshal does.
func checkShape(t *testing.T, b []byte, want *rlsv3.RateLimitRequest, wantErr error) {
	t.Helper()
	n, over := len(want.GetDescriptors()), false
	for _, d := range want.GetDescriptors() {
		over = over || len(d.GetEntries()) > maxEntries
	}
	if wantErr == nil && n <= maxDescriptors && !over {
		t.Fatalf("outOfBounds(%x), with %d descriptors", b, n)
	}
	got := &rlsv3.RateLimitRequest{}
	if err := newCodec().Unmarshal(mem.BufferSlice{mem.SliceBuffer(b)}, got); err != nil || wantErr != nil {
		return // either refuses the request
	}
	if got.GetDomain() != want.GetDomain() || got.GetHitsAddend() != want.GetHitsAddend() || len(got.GetDescriptors()) != n {
		t.Fatalf("codec read %x as domain %q, hits %d, %d descriptors; proto.Unmarshal as %q, %d, %d",
			b, got.GetDomain(), got.GetHitsAddend(), len(got.GetDescriptors()), want.GetDomain(), want.GetHitsAddend(), n)
	}
	for i, d := range got.GetDescriptors() {
		if n <= maxDescriptors && len(d.GetEntries()) != len(want.GetDescriptors()[i].GetEntries()) {
			t.Fatalf("codec read descriptor %d of %x with %d entries, proto.Unmarshal with %d", i, b, len(d.GetEntries()), len(want.GetDescriptors()[i].GetEntries()))
		}
	}
}

// TestRequestPastTheBounds: a request of many descriptors, or a
// descriptor of many entries, a few bytes each on the wire, is refused as
// invalid without an allocation per entry, whatever else it holds (a
// field the codec leaves to proto.Unmarshal).
func TestRequestPastTheBounds(t *testing.T) {
	many := func(descs, entries int, extra bool) []byte {
		req := &rlsv3.RateLimitRequest{Domain: "d"}
		for range descs {
			dd := &commonv3.RateLimitDescriptor{}
			for range entries {
				dd.Entries = append(dd.Entries, &commonv3.RateLimitDescriptor_Entry{})
			}
			req.Descriptors = append(req.Descriptors, dd)
		}
		if extra {
			req.Descriptors[0].Limit = &commonv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1}
		}
		b, err := proto.Marshal(req)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	for _, tc := range []struct {
		name           string
		descs, entries int
		extra          bool
	}{
		{"entries", 1, 200_000, false},
		{"entries beside an override", 1, 200_000, true},
		{"descriptors", 100_000, 1, false},
		{"descriptors beside an override", 100_000, 1, true},
		{"both", 65, 17, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := many(tc.descs, tc.entries, tc.extra)
			checkRequestCodec(t, b)
			var req rlsv3.RateLimitRequest
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			if err := unmarshalRequest(b, &req); err != nil {
				t.Fatal(err)
			}
			runtime.ReadMemStats(&after)
			// A pointer (8 bytes) for each entry or descriptor of 2 bytes.
			if n := after.TotalAlloc - before.TotalAlloc; n > 5*uint64(len(b)) {
				t.Errorf("%d bytes allocated for a request of %d bytes", n, len(b))
			}
			if len(req.Descriptors) != tc.descs {
				t.Errorf("read %d descriptors, want %d", len(req.Descriptors), tc.descs)
			}
			if tc.descs <= maxDescriptors && len(req.Descriptors[0].GetEntries()) != tc.entries {
				t.Errorf("read %d entries, want %d", len(req.Descriptors[0].GetEntries()), tc.entries)
			}
			c := new(call)
			if err := c.convert(&domain{name: "d"}, &req, nil); !errors.Is(err, errInvalid) {
				t.Errorf("convert: %v, want errInvalid", err)
			}
		})
	}
}

func TestRequestCodecSeeds(t *testing.T) {
	for _, b := range codecSeeds(t) {
		checkRequestCodec(t, b)
	}
}

// TestRequestCodecRandom checks decodeRequest on random requests of the
// fields it reads, as proto.Marshal writes them: it reads every one
// itself, as proto.Unmarshal does.
func TestRequestCodecRandom(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 14))
	for range 3000 {
		req := &rlsv3.RateLimitRequest{Domain: randString(r), HitsAddend: randUint32(r)}
		for range r.IntN(6) {
			dd := &commonv3.RateLimitDescriptor{IsNegativeHits: r.IntN(4) == 0}
			for range r.IntN(5) {
				dd.Entries = append(dd.Entries, &commonv3.RateLimitDescriptor_Entry{Key: randString(r), Value: randString(r)})
			}
			if r.IntN(3) == 0 {
				dd.HitsAddend = wrapperspb.UInt64([]uint64{0, 1, 1000, math.MaxUint32 + 1, math.MaxUint64}[r.IntN(5)])
			}
			req.Descriptors = append(req.Descriptors, dd)
		}
		b, err := proto.Marshal(req)
		if err != nil {
			t.Fatal(err)
		}
		got := &rlsv3.RateLimitRequest{}
		if !decodeRequest(b, got) {
			t.Fatalf("decodeRequest left %v to proto.Unmarshal", req)
		}
		if !proto.Equal(got, req) {
			t.Fatalf("decodeRequest read %v as %v", req, got)
		}
	}
}

// TestResponseCodecRandom checks marshalResponse on random responses:
// the bytes of proto.Marshal, for the responses it writes itself and for
// the ones it leaves to proto.Marshal; an error where proto.Marshal has
// one.
func TestResponseCodecRandom(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 15))
	plain := 0
	for i := range 3000 {
		resp := randResponse(r, i%5 == 0)
		if plainResponse(resp) {
			plain++
		}
		checkResponseCodec(t, resp)
	}
	if plain < 2000 {
		t.Fatalf("only %d of 3000 responses were written by hand", plain)
	}
}

func checkResponseCodec(t *testing.T, resp *rlsv3.RateLimitResponse) {
	t.Helper()
	want, wantErr := proto.MarshalOptions{Deterministic: true}.Marshal(resp)
	got, err := marshalResponse(resp)
	if (err == nil) != (wantErr == nil) {
		t.Fatalf("marshalResponse: %v, proto.Marshal: %v, on %v", err, wantErr, resp)
	}
	if err == nil && !sameResponse(resp, got, want) {
		t.Fatalf("marshalResponse wrote %v as\n%x, proto.Marshal as\n%x", resp, got, want)
	}
	data, err := newCodec().Marshal(resp)
	if (err == nil) != (wantErr == nil) {
		t.Fatalf("codec: %v, proto.Marshal: %v, on %v", err, wantErr, resp)
	}
	if err == nil && !sameResponse(resp, data.Materialize(), want) {
		t.Fatalf("codec wrote %v as %x, proto.Marshal as %x", resp, data.Materialize(), want)
	}
}

// sameResponse tells whether got is want, the bytes of resp by
// proto.Marshal: the same bytes when marshalResponse writes resp itself,
// else the same message (the order of a map's entries varies).
func sameResponse(resp *rlsv3.RateLimitResponse, got, want []byte) bool {
	if plainResponse(resp) {
		return bytes.Equal(got, want)
	}
	g, w := &rlsv3.RateLimitResponse{}, &rlsv3.RateLimitResponse{}
	return proto.Unmarshal(got, g) == nil && proto.Unmarshal(want, w) == nil && proto.Equal(g, w)
}

// FuzzResponseCodec checks marshalResponse on the responses that
// arbitrary bytes decode to, unknown fields and all.
func FuzzResponseCodec(f *testing.F) {
	r := rand.New(rand.NewPCG(1, 2))
	for i := range 20 {
		if b, err := proto.Marshal(randResponse(r, i%4 == 0)); err == nil {
			f.Add(b)
		}
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		resp := &rlsv3.RateLimitResponse{}
		if proto.Unmarshal(b, resp) != nil {
			return
		}
		checkResponseCodec(t, resp)
	})
}

// randResponse is a response of the fields the server sets, and, when
// odd, of some others: request headers, quota, metadata, a raw header
// value, a string not in UTF-8, unknown fields.
func randResponse(r *rand.Rand, odd bool) *rlsv3.RateLimitResponse {
	resp := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_Code(r.IntN(4))}
	for range r.IntN(5) {
		st := &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_Code(r.IntN(3)), LimitRemaining: randUint32(r)}
		if r.IntN(2) == 0 {
			st.CurrentLimit = &rlsv3.RateLimitResponse_RateLimit{Name: randString(r), RequestsPerUnit: randUint32(r), Unit: rlsv3.RateLimitResponse_RateLimit_Unit(r.IntN(8))}
			if r.IntN(3) == 0 {
				st.CurrentLimit.UnitMultiplier = wrapperspb.UInt32(randUint32(r))
			}
		}
		if r.IntN(2) == 0 {
			st.DurationUntilReset = &durationpb.Duration{Seconds: r.Int64N(1<<40) - 1<<39, Nanos: r.Int32N(2e9) - 1e9}
		}
		resp.Statuses = append(resp.Statuses, st)
	}
	for range r.IntN(5) {
		resp.ResponseHeadersToAdd = append(resp.ResponseHeadersToAdd, &corev3.HeaderValue{Key: randString(r), Value: randString(r)})
	}
	if r.IntN(3) == 0 {
		resp.RawBody = []byte(randString(r))
	}
	if !odd {
		return resp
	}
	switch r.IntN(6) {
	case 0:
		resp.RequestHeadersToAdd = []*corev3.HeaderValue{{Key: "k", Value: "v"}}
	case 1:
		resp.Quota = &rlsv3.RateLimitResponse_Quota{Requests: 3}
	case 2:
		resp.DynamicMetadata, _ = structpb.NewStruct(map[string]any{"a": "b", "c": 1.0})
	case 3:
		resp.ResponseHeadersToAdd = append(resp.ResponseHeadersToAdd, &corev3.HeaderValue{Key: "k", RawValue: []byte{1}})
	case 4:
		resp.ResponseHeadersToAdd = append(resp.ResponseHeadersToAdd, &corev3.HeaderValue{Key: "k", Value: "\xff"})
	default:
		resp.ProtoReflect().SetUnknown(protowire.AppendVarint(protowire.AppendTag(nil, 99, protowire.VarintType), 7))
	}
	return resp
}

// randString is a string of ASCII, of runes of 2 to 4 bytes, or empty.
func randString(r *rand.Rand) string {
	runes := []rune{'a', 'z', '0', ':', '%', '{', 'é', '€', '😀', 0}
	var b []rune
	for range r.IntN(12) {
		b = append(b, runes[r.IntN(len(runes))])
	}
	return string(b)
}

func randUint32(r *rand.Rand) uint32 {
	switch r.IntN(4) {
	case 0:
		return 0
	case 1:
		return math.MaxUint32
	}
	return r.Uint32N(1 << (r.IntN(4) * 8))
}

// BenchmarkCodec reads the 3-descriptor request of bench/rls.sh and writes
// an answer of 3 statuses and the RateLimit fields, by the codec and by
// the generated code (proto).
func BenchmarkCodec(b *testing.B) {
	req, err := proto.Marshal(&rlsv3.RateLimitRequest{Domain: "costgate", HitsAddend: 1, Descriptors: []*commonv3.RateLimitDescriptor{
		descOf("tenant", "bench-7"), descOf("tenant", "bench-7", "generic_key", "search"), descOf("remote_address", "10.0.0.7"),
	}})
	if err != nil {
		b.Fatal(err)
	}
	cur := &rlsv3.RateLimitResponse_RateLimit{Name: "bench-tenant", RequestsPerUnit: 1000000000, Unit: rlsv3.RateLimitResponse_RateLimit_MINUTE}
	st := func() *rlsv3.RateLimitResponse_DescriptorStatus {
		return &rlsv3.RateLimitResponse_DescriptorStatus{Code: codeOK, CurrentLimit: cur, LimitRemaining: 999999999, DurationUntilReset: &durationpb.Duration{Nanos: 60000}}
	}
	resp := &rlsv3.RateLimitResponse{OverallCode: codeOK, Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{st(), st(), st()},
		ResponseHeadersToAdd: []*corev3.HeaderValue{{Key: "RateLimit-Policy", Value: `"bench-tenant";q=1000000000;w=60`}, {Key: "RateLimit", Value: `"bench-tenant";r=999999999;t=1`}}}
	c := newCodec()
	for _, name := range []string{"codec", "proto"} {
		b.Run("request/"+name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				r := &rlsv3.RateLimitRequest{}
				var err error
				if name == "codec" {
					err = c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(req)}, r)
				} else {
					err = c.proto.Unmarshal(mem.BufferSlice{mem.SliceBuffer(req)}, r)
				}
				if err != nil || len(r.Descriptors) != 3 {
					b.Fatal(err)
				}
			}
		})
		b.Run("response/"+name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				var data mem.BufferSlice
				var err error
				if name == "codec" {
					data, err = c.Marshal(resp)
				} else {
					data, err = c.proto.Marshal(resp)
				}
				if err != nil || data.Len() == 0 {
					b.Fatal(err)
				}
				data.Free()
			}
		})
	}
}
