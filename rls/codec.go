package rls

// The server's gRPC codec reads a RateLimitRequest without protobuf
// reflection: a first pass over the wire bytes counts its descriptors and
// entries, a second fills them in a few allocations, all its strings
// pointing into one copy of the message. Anything it does not expect (an
// unknown field, a field of another wire type, a descriptor's limit
// override, a message field twice, a domain that is not UTF-8, malformed
// bytes) goes to proto.Unmarshal instead, so that the codec accepts,
// refuses and reads exactly what the generated code does, with two
// exceptions. An entry's key or value that is not UTF-8 is read as its
// bytes, where the generated code refuses the whole request: Envoy's C++
// protobuf writes a header's obs-text bytes as they are, and a request
// the server cannot read is an error, which Envoy lets through unlimited
// by default (see the server's reading of such values, ledgerText). And
// a request past the bounds (maxDescriptors, maxEntries) is read for its
// shape alone, for the server to refuse. A RateLimitResponse of the
// fields the server sets is written without reflection too, byte for
// byte as proto.Marshal writes it, and any other by proto.Marshal; every
// other message (health, reflection) goes to gRPC's proto codec.

import (
	"bytes"
	"errors"
	"fmt"
	"unicode/utf8"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// codec is the server's encoding.CodecV2. It is safe for concurrent use.
type codec struct {
	proto encoding.CodecV2 // gRPC's, for every other message
}

var _ encoding.CodecV2 = codec{}

func newCodec() codec {
	return codec{proto: encoding.GetCodecV2(grpcproto.Name)}
}

// Name is "proto": the codec speaks the protobuf wire format.
func (codec) Name() string { return grpcproto.Name }

// Marshal writes v: a RateLimitResponse by marshalResponse, anything else
// by the proto codec.
func (c codec) Marshal(v any) (mem.BufferSlice, error) {
	resp, ok := v.(*rlsv3.RateLimitResponse)
	if !ok {
		return c.proto.Marshal(v)
	}
	b, err := marshalResponse(resp)
	if err != nil {
		return nil, err
	}
	return mem.BufferSlice{mem.SliceBuffer(b)}, nil
}

// marshalResponse is resp in the protobuf wire format, as proto.Marshal
// writes it (see response_codec.go).
func marshalResponse(resp *rlsv3.RateLimitResponse) ([]byte, error) {
	if !plainResponse(resp) {
		b, err := proto.Marshal(resp)
		if err != nil {
			return nil, fmt.Errorf("rls: marshal response: %w", err)
		}
		return b, nil
	}
	n := sizeResponse(resp)
	b := appendResponse(make([]byte, 0, n), resp)
	if len(b) != n {
		return nil, fmt.Errorf("rls: marshal response: %d bytes written, %d sized", len(b), n)
	}
	return b, nil
}

// Unmarshal reads data into v: a RateLimitRequest by decodeRequest,
// anything else by the proto codec.
func (c codec) Unmarshal(data mem.BufferSlice, v any) error {
	req, ok := v.(*rlsv3.RateLimitRequest)
	if !ok {
		return c.proto.Unmarshal(data, v)
	}
	var b []byte
	if len(data) == 1 {
		b = data[0].ReadOnlyData()
	} else {
		b = data.Materialize()
	}
	return unmarshalRequest(b, req)
}

// unmarshalRequest reads b into req as proto.Unmarshal does: by
// decodeRequest when it can, else by proto.Unmarshal. A request past the
// bounds (more than maxDescriptors descriptors, or a descriptor of more
// than maxEntries entries), which the server refuses, is read for its
// shape alone (decodeShape): a few bytes on the wire per entry must not
// cost an allocation each.
func unmarshalRequest(b []byte, req *rlsv3.RateLimitRequest) error {
	if decodeRequest(b, req) {
		return nil
	}
	proto.Reset(req)
	if outOfBounds(b) {
		return decodeShape(b, req)
	}
	err := proto.Unmarshal(b, req)
	if err == nil {
		return nil
	}
	valid, ok := validEntries(b)
	if !ok {
		return err
	}
	proto.Reset(req)
	if proto.Unmarshal(valid, req) != nil {
		return err
	}
	readEntries(b, req)
	return nil
}

// validEntries is a copy of b, a RateLimitRequest, in which each byte of
// an entry's key or value that is not UTF-8 is '?'; ok is false when no
// entry holds one, or b is malformed. The copy has b's layout: the
// message proto.Unmarshal reads from it has b's descriptors and entries,
// in b's order, for readEntries to give them b's keys and values.
func validEntries(b []byte) (valid []byte, ok bool) {
	valid = bytes.Clone(b)
	eachEntry(valid, func(_, _ int, num protowire.Number, v []byte) {
		for i := 0; i < len(v); {
			r, n := utf8.DecodeRune(v[i:])
			if r == utf8.RuneError && n == 1 {
				v[i], ok = '?', true
			}
			i += n
		}
	})
	return valid, ok
}

// readEntries sets the key and value of each entry of req, which
// proto.Unmarshal read from validEntries(b), to b's: the last of each, as
// proto.Unmarshal reads them.
func readEntries(b []byte, req *rlsv3.RateLimitRequest) {
	eachEntry(b, func(d, e int, num protowire.Number, v []byte) {
		en := req.Descriptors[d].Entries[e]
		if num == 1 {
			en.Key = string(v)
		} else {
			en.Value = string(v)
		}
	})
}

// eachEntry calls f with each key (num 1) and value (num 2) field of each
// entry of the request b, in order, with the index of its descriptor and
// its index there; v is a part of b.
func eachEntry(b []byte, f func(d, e int, num protowire.Number, v []byte)) {
	d := 0
	eachField(b, func(num protowire.Number, typ protowire.Type, desc []byte) bool {
		if num != 2 || typ != protowire.BytesType {
			return true
		}
		e := 0
		eachField(desc, func(num protowire.Number, typ protowire.Type, entry []byte) bool {
			if num != 1 || typ != protowire.BytesType {
				return true
			}
			eachField(entry, func(num protowire.Number, typ protowire.Type, v []byte) bool {
				if typ == protowire.BytesType && (num == 1 || num == 2) {
					f(d, e, num, v)
				}
				return true
			})
			e++
			return true
		})
		d++
		return true
	})
}

// outOfBounds tells whether b, a RateLimitRequest on the wire, has more
// than maxDescriptors descriptors or a descriptor of more than maxEntries
// entries, whatever other fields it holds; false for malformed bytes,
// which proto.Unmarshal refuses.
func outOfBounds(b []byte) bool {
	descs, over := 0, false
	ok := eachField(b, func(num protowire.Number, typ protowire.Type, v []byte) bool {
		if num != 2 || typ != protowire.BytesType {
			return true
		}
		descs++
		entries, ok := countMessages(v, 1)
		over = over || entries > maxEntries
		return ok
	})
	return ok && (over || descs > maxDescriptors)
}

// countMessages counts the length-delimited fields num of the message b
// (a request's descriptors, a descriptor's entries); ok is false when b
// is malformed.
func countMessages(b []byte, num protowire.Number) (n int, ok bool) {
	ok = eachField(b, func(f protowire.Number, typ protowire.Type, _ []byte) bool {
		if f == num && typ == protowire.BytesType {
			n++
		}
		return true
	})
	return n, ok
}

// eachField calls f with each field of the message b and its value's
// bytes (a length-delimited field's without its length) until f returns
// false; it returns false when b is malformed or f stopped.
func eachField(b []byte, f func(num protowire.Number, typ protowire.Type, v []byte) bool) bool {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return false
		}
		b = b[n:]
		var v []byte
		if typ == protowire.BytesType {
			v, n = protowire.ConsumeBytes(b)
		} else {
			n = protowire.ConsumeFieldValue(num, typ, b)
			if n >= 0 {
				v = b[:n]
			}
		}
		if n < 0 {
			return false
		}
		b = b[n:]
		if !f(num, typ, v) {
			return false
		}
	}
	return true
}

// decodeShape fills req from b, a well-formed request past the bounds,
// with what the server needs to refuse it: its domain and hits_addend,
// as many descriptors as b has (all the same empty one when they are more
// than maxDescriptors), and, when they are not, as many entries in each
// as it has (all the same empty one). It fails where proto.Unmarshal
// fails on the domain.
func decodeShape(b []byte, req *rlsv3.RateLimitRequest) error {
	n, _ := countMessages(b, 2)
	req.Descriptors = make([]*commonv3.RateLimitDescriptor, 0, n)
	empty := &commonv3.RateLimitDescriptor{}
	entry := &commonv3.RateLimitDescriptor_Entry{}
	var err error
	eachField(b, func(num protowire.Number, typ protowire.Type, v []byte) bool {
		switch {
		case num == 1 && typ == protowire.BytesType:
			if !utf8.Valid(v) {
				err = errors.New("rls: the request's domain is not valid UTF-8")
				return false
			}
			req.Domain = string(v)
		case num == 3 && typ == protowire.VarintType:
			h, _ := protowire.ConsumeVarint(v)
			req.HitsAddend = uint32(h)
		case num == 2 && typ == protowire.BytesType && n > maxDescriptors:
			req.Descriptors = append(req.Descriptors, empty)
		case num == 2 && typ == protowire.BytesType:
			ne, _ := countMessages(v, 1)
			d := &commonv3.RateLimitDescriptor{Entries: make([]*commonv3.RateLimitDescriptor_Entry, ne)}
			for i := range d.Entries {
				d.Entries[i] = entry
			}
			req.Descriptors = append(req.Descriptors, d)
		}
		return true
	})
	return err
}

// The tags (field number and wire type) of the fields decodeRequest reads.
const (
	tagDomain      = 1<<3 | uint64(protowire.BytesType)  // RateLimitRequest.domain
	tagDescriptor  = 2<<3 | uint64(protowire.BytesType)  // RateLimitRequest.descriptors
	tagHitsAddend  = 3<<3 | uint64(protowire.VarintType) // RateLimitRequest.hits_addend
	tagEntry       = 1<<3 | uint64(protowire.BytesType)  // RateLimitDescriptor.entries
	tagDescHits    = 3<<3 | uint64(protowire.BytesType)  // RateLimitDescriptor.hits_addend
	tagNegative    = 4<<3 | uint64(protowire.VarintType) // RateLimitDescriptor.is_negative_hits
	tagKey         = 1<<3 | uint64(protowire.BytesType)  // Entry.key
	tagValue       = 2<<3 | uint64(protowire.BytesType)  // Entry.value
	tagWrapperUint = 1<<3 | uint64(protowire.VarintType) // UInt64Value.value
)

// decodeRequest fills req, which is empty, from b and tells whether it
// could; false leaves req partly filled, for proto.Unmarshal to read b
// again.
func decodeRequest(b []byte, req *rlsv3.RateLimitRequest) bool {
	nd, ne, ok := countRequest(b)
	if !ok {
		return false
	}
	s := string(b) // every string of req is a part of s
	var (
		descs   []commonv3.RateLimitDescriptor
		entries []commonv3.RateLimitDescriptor_Entry
		eptrs   []*commonv3.RateLimitDescriptor_Entry
	)
	if nd > 0 {
		descs = make([]commonv3.RateLimitDescriptor, nd)
		req.Descriptors = make([]*commonv3.RateLimitDescriptor, nd)
	}
	if ne > 0 {
		entries = make([]commonv3.RateLimitDescriptor_Entry, ne)
		eptrs = make([]*commonv3.RateLimitDescriptor_Entry, ne)
	}
	d, e := 0, 0
	for i := 0; i < len(b); {
		tag, n := protowire.ConsumeVarint(b[i:])
		i += n
		switch tag {
		case tagDomain:
			start, end := bytesAt(b, i)
			if !utf8.Valid(b[start:end]) {
				return false
			}
			req.Domain = s[start:end]
			i = end
		case tagHitsAddend:
			v, n := protowire.ConsumeVarint(b[i:])
			req.HitsAddend = uint32(v)
			i += n
		case tagDescriptor:
			start, end := bytesAt(b, i)
			dd := &descs[d]
			req.Descriptors[d] = dd
			d++
			e0 := e
			if !decodeDescriptor(b, s, start, end, dd, entries, &e) {
				return false
			}
			if e > e0 {
				dd.Entries = eptrs[e0:e:e]
				for k := e0; k < e; k++ {
					eptrs[k] = &entries[k]
				}
			}
			i = end
		default:
			return false // countRequest let no other field through
		}
	}
	return true
}

// decodeDescriptor fills dd from b[start:end], its entries from
// entries[*e], and advances *e past them.
func decodeDescriptor(b []byte, s string, start, end int, dd *commonv3.RateLimitDescriptor, entries []commonv3.RateLimitDescriptor_Entry, e *int) bool {
	for i := start; i < end; {
		tag, n := protowire.ConsumeVarint(b[i:end])
		i += n
		switch tag {
		case tagEntry:
			es, ee := bytesAt(b[:end], i)
			en := &entries[*e]
			*e++
			for j := es; j < ee; {
				tag, n := protowire.ConsumeVarint(b[j:ee])
				j += n
				vs, ve := bytesAt(b[:ee], j)
				if tag == tagKey {
					en.Key = s[vs:ve]
				} else {
					en.Value = s[vs:ve]
				}
				j = ve
			}
			i = ee
		case tagDescHits:
			hs, he := bytesAt(b[:end], i)
			var v uint64
			for j := hs; j < he; {
				_, n := protowire.ConsumeVarint(b[j:he]) // tagWrapperUint
				j += n
				v, n = protowire.ConsumeVarint(b[j:he])
				j += n
			}
			dd.HitsAddend = wrapperspb.UInt64(v)
			i = he
		case tagNegative:
			v, n := protowire.ConsumeVarint(b[i:end])
			dd.IsNegativeHits = v != 0
			i += n
		}
	}
	return true
}

// bytesAt returns where the bytes of the length-delimited field whose
// length is at b[i] start and end. countRequest has checked them.
func bytesAt(b []byte, i int) (start, end int) {
	l, n := protowire.ConsumeVarint(b[i:])
	return i + n, i + n + int(l)
}

// countRequest checks that b is a RateLimitRequest that decodeRequest
// reads (only the fields it knows, each of its wire type, and no message
// field twice, within the bounds) and counts its descriptors and entries.
func countRequest(b []byte) (descs, entries int, ok bool) {
	for len(b) > 0 {
		tag, n := protowire.ConsumeVarint(b)
		if n < 0 {
			return 0, 0, false
		}
		b = b[n:]
		switch tag {
		case tagHitsAddend:
			n = len(b) - len(skipVarint(b))
			if n == 0 {
				return 0, 0, false
			}
			b = b[n:]
			continue
		case tagDomain, tagDescriptor:
		default:
			return 0, 0, false
		}
		v, n := protowire.ConsumeBytes(b)
		if n < 0 {
			return 0, 0, false
		}
		b = b[n:]
		if tag == tagDescriptor {
			ne, ok := countDescriptor(v)
			if !ok || ne > maxEntries {
				return 0, 0, false
			}
			descs++
			entries += ne
		}
	}
	if descs > maxDescriptors {
		return 0, 0, false // past the bounds: see unmarshalRequest
	}
	return descs, entries, true
}

// countDescriptor checks a RateLimitDescriptor as countRequest does and
// counts its entries.
func countDescriptor(b []byte) (entries int, ok bool) {
	hits := false
	for len(b) > 0 {
		tag, n := protowire.ConsumeVarint(b)
		if n < 0 {
			return 0, false
		}
		b = b[n:]
		switch tag {
		case tagNegative:
			n = len(b) - len(skipVarint(b))
			if n == 0 {
				return 0, false
			}
			b = b[n:]
			continue
		case tagEntry, tagDescHits:
		default:
			return 0, false
		}
		v, n := protowire.ConsumeBytes(b)
		if n < 0 {
			return 0, false
		}
		b = b[n:]
		switch tag {
		case tagEntry:
			if !checkFields(v, tagKey, tagValue, protowire.BytesType) {
				return 0, false
			}
			entries++
		case tagDescHits:
			if hits || !checkFields(v, tagWrapperUint, tagWrapperUint, protowire.VarintType) {
				return 0, false // a second hits_addend merges into the first
			}
			hits = true
		}
	}
	return entries, true
}

// checkFields checks that b, a message, holds only fields of tags t1 and
// t2, both of wire type typ.
func checkFields(b []byte, t1, t2 uint64, typ protowire.Type) bool {
	for len(b) > 0 {
		tag, n := protowire.ConsumeVarint(b)
		if n < 0 || (tag != t1 && tag != t2) {
			return false
		}
		b = b[n:]
		if typ == protowire.VarintType {
			n = len(b) - len(skipVarint(b))
			if n == 0 {
				return false
			}
		} else {
			_, n = protowire.ConsumeBytes(b)
			if n < 0 {
				return false
			}
		}
		b = b[n:]
	}
	return true
}

// skipVarint returns b after its first varint; b itself when it holds
// none.
func skipVarint(b []byte) []byte {
	_, n := protowire.ConsumeVarint(b)
	if n < 0 {
		return b
	}
	return b[n:]
}
