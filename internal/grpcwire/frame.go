package grpcwire

// HTTP/2 framing (RFC 9113, section 4 and 6) and the few HPACK (RFC 7541)
// representations the server writes. The server never indexes what it
// writes, so it keeps no encoder state: every header block it sends is a
// static-table reference or a literal without indexing.

import (
	"encoding/binary"
	"fmt"
	"strconv"
	"unicode/utf8"
)

// Frame types.
const (
	frameData         = 0x0
	frameHeaders      = 0x1
	framePriority     = 0x2
	frameRSTStream    = 0x3
	frameSettings     = 0x4
	framePushPromise  = 0x5
	framePing         = 0x6
	frameGoAway       = 0x7
	frameWindowUpdate = 0x8
	frameContinuation = 0x9
)

// Frame flags.
const (
	flagEndStream  = 0x1
	flagAck        = 0x1
	flagEndHeaders = 0x4
	flagPadded     = 0x8
	flagPriority   = 0x20
)

// Settings.
const (
	settingEnablePush           = 0x2
	settingMaxConcurrentStreams = 0x3
	settingInitialWindowSize    = 0x4
	settingMaxFrameSize         = 0x5
	settingMaxHeaderListSize    = 0x6
)

// Error codes.
const (
	codeNo           = 0x0
	codeProtocol     = 0x1
	codeFlowControl  = 0x3
	codeStreamClosed = 0x5
	codeFrameSize    = 0x6
	codeRefused      = 0x7
	codeCompression  = 0x9
	codeCalm         = 0xb
)

const (
	preface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
	// maxFrame is the largest frame payload read: SETTINGS_MAX_FRAME_SIZE's
	// default, which the server does not raise.
	maxFrame = 16384
	// defaultWindow is HTTP/2's initial flow-control window, the stream
	// windows' here.
	defaultWindow = 65535
	// maxWindow is the largest flow-control window.
	maxWindow = 1<<31 - 1
	// maxHeaderBlock bounds a request's header block, whatever number of
	// CONTINUATION frames carry it, and its decoded header list.
	maxHeaderBlock = 64 << 10
)

// connError is an error of the whole connection: the server sends GOAWAY
// with its code and closes.
type connError struct {
	code uint32
	msg  string
}

func (e connError) Error() string {
	return fmt.Sprintf("grpcwire: connection error %d: %s", e.code, e.msg)
}

// appendFrame appends a frame header for a payload of n bytes.
func appendFrame(b []byte, n int, typ, flags byte, stream uint32) []byte {
	return append(b, byte(n>>16), byte(n>>8), byte(n), typ, flags,
		byte(stream>>24)&0x7f, byte(stream>>16), byte(stream>>8), byte(stream))
}

func appendWindowUpdate(b []byte, stream uint32, inc uint32) []byte {
	b = appendFrame(b, 4, frameWindowUpdate, 0, stream)
	return binary.BigEndian.AppendUint32(b, inc)
}

func appendRST(b []byte, stream uint32, code uint32) []byte {
	b = appendFrame(b, 4, frameRSTStream, 0, stream)
	return binary.BigEndian.AppendUint32(b, code)
}

func appendGoAway(b []byte, last uint32, code uint32, debug string) []byte {
	b = appendFrame(b, 8+len(debug), frameGoAway, 0, 0)
	b = binary.BigEndian.AppendUint32(b, last)
	b = binary.BigEndian.AppendUint32(b, code)
	return append(b, debug...)
}

func appendSetting(b []byte, id uint16, v uint32) []byte {
	b = binary.BigEndian.AppendUint16(b, id)
	return binary.BigEndian.AppendUint32(b, v)
}

// appendHpackInt appends v as an HPACK integer of an n-bit prefix, the
// first byte's other bits set to first (RFC 7541, 5.1).
func appendHpackInt(b []byte, first byte, n uint, v uint64) []byte {
	max := uint64(1)<<n - 1
	if v < max {
		return append(b, first|byte(v))
	}
	b = append(b, first|byte(max))
	v -= max
	for v >= 128 {
		b = append(b, byte(v&0x7f)|0x80)
		v >>= 7
	}
	return append(b, byte(v))
}

// appendHpackString appends s as an HPACK string literal, not Huffman
// coded.
func appendHpackString(b []byte, s string) []byte {
	b = appendHpackInt(b, 0, 7, uint64(len(s)))
	return append(b, s...)
}

// appendLiteral appends the field name: value as a literal without
// indexing, with a literal name.
func appendLiteral(b []byte, name, value string) []byte {
	b = append(b, 0)
	b = appendHpackString(b, name)
	return appendHpackString(b, value)
}

// Static table indexes (RFC 7541, appendix A).
const (
	staticStatus200   = 8
	staticStatus      = 8 // :status, as a name
	staticContentType = 31
)

// appendResponseHeaders appends the header block of an answer's start:
// :status (200 from the static table, else a literal) and content-type
// application/grpc.
func appendResponseHeaders(b []byte, httpStatus int) []byte {
	if httpStatus == 200 {
		b = append(b, 0x80|staticStatus200)
	} else {
		b = appendHpackInt(b, 0, 4, staticStatus)
		b = appendHpackString(b, strconv.Itoa(httpStatus))
	}
	b = appendHpackInt(b, 0, 4, staticContentType)
	return appendHpackString(b, "application/grpc")
}

// maxMessageText bounds grpc-message, before it is percent-encoded, so
// that a trailer block fits in one frame of the smallest size allowed.
const maxMessageText = 1024

// appendStatus appends grpc-status code and, unless msg is empty,
// grpc-message msg, percent-encoded as gRPC says (bytes outside 0x20 to
// 0x7e, and '%').
func appendStatus(b []byte, code uint32, msg string) []byte {
	var num [10]byte
	b = appendLiteral(b, "grpc-status", string(strconv.AppendUint(num[:0], uint64(code), 10)))
	if msg == "" {
		return b
	}
	if len(msg) > maxMessageText {
		i := maxMessageText
		for i > maxMessageText-utf8.UTFMax+1 && !utf8.RuneStart(msg[i]) {
			i-- // cut before the rune msg[i] is inside, not in it
		}
		msg = msg[:i]
	}
	enc := make([]byte, 0, len(msg))
	const hex = "0123456789ABCDEF"
	for i := 0; i < len(msg); i++ {
		c := msg[i]
		if c < 0x20 || c > 0x7e || c == '%' {
			enc = append(enc, '%', hex[c>>4], hex[c&0xf])
			continue
		}
		enc = append(enc, c)
	}
	return appendLiteral(b, "grpc-message", string(enc))
}
