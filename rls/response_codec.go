package rls

// A RateLimitResponse written by hand, in the order and encoding of
// proto.Marshal (fields by number, proto3 zero values left out), for the
// fields the server sets: overall_code, statuses (code, current_limit,
// limit_remaining, duration_until_reset), response_headers_to_add (key,
// value) and raw_body. plainResponse tells whether a response holds no
// other; marshalResponse gives any other to proto.Marshal.

import (
	"unicode/utf8"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// plainResponse tells whether resp holds only the fields appendResponse
// writes, each valid as proto.Marshal requires (strings in UTF-8, no nil
// element in a list).
func plainResponse(resp *rlsv3.RateLimitResponse) bool {
	if len(resp.RequestHeadersToAdd) > 0 || resp.DynamicMetadata != nil || resp.Quota != nil || unknown(resp) {
		return false
	}
	for _, st := range resp.Statuses {
		if st == nil || st.Quota != nil || unknown(st) {
			return false
		}
		if cl := st.CurrentLimit; cl != nil {
			if unknown(cl) || !utf8.ValidString(cl.Name) || (cl.UnitMultiplier != nil && unknown(cl.UnitMultiplier)) {
				return false
			}
		}
		if d := st.DurationUntilReset; d != nil && unknown(d) {
			return false
		}
	}
	for _, h := range resp.ResponseHeadersToAdd {
		if h == nil || len(h.RawValue) > 0 || unknown(h) || !utf8.ValidString(h.Key) || !utf8.ValidString(h.Value) {
			return false
		}
	}
	return true
}

// unknown tells whether m holds unknown fields.
func unknown(m proto.Message) bool {
	return len(m.ProtoReflect().GetUnknown()) > 0
}

// sizeResponse is the length of appendResponse's bytes.
func sizeResponse(resp *rlsv3.RateLimitResponse) int {
	n := sizeVarintField(uint64(resp.OverallCode))
	for _, st := range resp.Statuses {
		n += sizeMessageField(sizeStatus(st))
	}
	for _, h := range resp.ResponseHeadersToAdd {
		n += sizeMessageField(sizeHeader(h))
	}
	if len(resp.RawBody) > 0 {
		n += sizeMessageField(len(resp.RawBody))
	}
	return n
}

// appendResponse appends resp, plain, to b.
func appendResponse(b []byte, resp *rlsv3.RateLimitResponse) []byte {
	b = appendVarintField(b, 1, uint64(resp.OverallCode))
	for _, st := range resp.Statuses {
		b = protowire.AppendTag(b, 2, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(sizeStatus(st)))
		b = appendStatus(b, st)
	}
	for _, h := range resp.ResponseHeadersToAdd {
		b = protowire.AppendTag(b, 3, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(sizeHeader(h)))
		b = appendStringField(b, 1, h.Key)
		b = appendStringField(b, 2, h.Value)
	}
	if len(resp.RawBody) > 0 {
		b = protowire.AppendTag(b, 5, protowire.BytesType)
		b = protowire.AppendBytes(b, resp.RawBody)
	}
	return b
}

func sizeStatus(st *rlsv3.RateLimitResponse_DescriptorStatus) int {
	n := sizeVarintField(uint64(st.Code))
	if st.CurrentLimit != nil {
		n += sizeMessageField(sizeRateLimit(st.CurrentLimit))
	}
	n += sizeVarintField(uint64(st.LimitRemaining))
	if st.DurationUntilReset != nil {
		n += sizeMessageField(sizeDuration(st.DurationUntilReset))
	}
	return n
}

func appendStatus(b []byte, st *rlsv3.RateLimitResponse_DescriptorStatus) []byte {
	b = appendVarintField(b, 1, uint64(st.Code))
	if cl := st.CurrentLimit; cl != nil {
		b = protowire.AppendTag(b, 2, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(sizeRateLimit(cl)))
		b = appendVarintField(b, 1, uint64(cl.RequestsPerUnit))
		b = appendVarintField(b, 2, uint64(cl.Unit))
		b = appendStringField(b, 3, cl.Name)
		if m := cl.UnitMultiplier; m != nil {
			b = protowire.AppendTag(b, 4, protowire.BytesType)
			b = protowire.AppendVarint(b, uint64(sizeUInt32(m)))
			b = appendVarintField(b, 1, uint64(m.Value))
		}
	}
	b = appendVarintField(b, 3, uint64(st.LimitRemaining))
	if d := st.DurationUntilReset; d != nil {
		b = protowire.AppendTag(b, 4, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(sizeDuration(d)))
		b = appendVarintField(b, 1, uint64(d.Seconds))
		b = appendVarintField(b, 2, uint64(int64(d.Nanos)))
	}
	return b
}

func sizeRateLimit(cl *rlsv3.RateLimitResponse_RateLimit) int {
	n := sizeVarintField(uint64(cl.RequestsPerUnit)) + sizeVarintField(uint64(cl.Unit)) + sizeStringField(cl.Name)
	if cl.UnitMultiplier != nil {
		n += sizeMessageField(sizeUInt32(cl.UnitMultiplier))
	}
	return n
}

func sizeUInt32(m *wrapperspb.UInt32Value) int {
	return sizeVarintField(uint64(m.Value))
}

func sizeDuration(d *durationpb.Duration) int {
	return sizeVarintField(uint64(d.Seconds)) + sizeVarintField(uint64(int64(d.Nanos)))
}

func sizeHeader(h *corev3.HeaderValue) int {
	return sizeStringField(h.Key) + sizeStringField(h.Value)
}

// sizeVarintField is the length of a varint field (of a number below 16)
// of value v; 0 for 0, which proto3 leaves out.
func sizeVarintField(v uint64) int {
	if v == 0 {
		return 0
	}
	return 1 + protowire.SizeVarint(v)
}

func appendVarintField(b []byte, num protowire.Number, v uint64) []byte {
	if v == 0 {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.VarintType)
	return protowire.AppendVarint(b, v)
}

func sizeStringField(s string) int {
	if s == "" {
		return 0
	}
	return sizeMessageField(len(s))
}

func appendStringField(b []byte, num protowire.Number, s string) []byte {
	if s == "" {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendString(b, s)
}

// sizeMessageField is the length of a length-delimited field (of a number
// below 16) of n bytes.
func sizeMessageField(n int) int {
	return 1 + protowire.SizeBytes(n)
}
