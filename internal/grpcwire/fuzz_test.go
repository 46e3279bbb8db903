package grpcwire

import (
	"bytes"
	"io"
	"net"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// fuzzSeeds are client byte streams, after the preface and SETTINGS:
// valid requests of each kind, and some of the frames around them.
func fuzzSeeds() [][]byte {
	var out bytes.Buffer
	fr := http2.NewFramer(&out, nil)
	fr.AllowIllegalWrites = true
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	block := func(path string, extra ...string) []byte {
		hb.Reset()
		fields := append([]string{":method", "POST", ":scheme", "http", ":path", path, "content-type", "application/grpc"}, extra...)
		for i := 0; i < len(fields); i += 2 {
			enc.WriteField(hpack.HeaderField{Name: fields[i], Value: fields[i+1]})
		}
		return bytes.Clone(hb.Bytes())
	}
	take := func() []byte {
		b := bytes.Clone(out.Bytes())
		out.Reset()
		return b
	}
	var seeds [][]byte
	for _, path := range []string{"/grpc.health.v1.Health/Check", pathEcho, pathWatch, pathPanic, pathBlock, pathBig, "/x/y"} {
		fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block(path), EndHeaders: true})
		fr.WriteData(1, true, grpcMessage([]byte{0x08, 0x10}))
		seeds = append(seeds, take())
	}
	b := block(pathEcho, "grpc-timeout", "10m")
	fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 3, BlockFragment: b[:4], PadLength: 3, Priority: http2.PriorityParam{StreamDep: 1, Weight: 9}})
	fr.WriteContinuation(3, true, b[4:])
	fr.WriteDataPadded(3, false, grpcMessage([]byte("abc"))[:4], []byte{0, 0})
	fr.WriteWindowUpdate(3, 100)
	fr.WriteDataPadded(3, true, grpcMessage([]byte("abc"))[4:], nil)
	fr.WritePing(false, [8]byte{1})
	fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 3}, http2.Setting{ID: http2.SettingMaxFrameSize, Val: 20000})
	fr.WriteWindowUpdate(0, 1000)
	fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 5, BlockFragment: block(pathBlock), EndHeaders: true, EndStream: true})
	fr.WriteRSTStream(5, http2.ErrCodeCancel)
	fr.WriteGoAway(0, http2.ErrCodeNo, nil)
	seeds = append(seeds, take())
	return seeds
}

// FuzzConn feeds a connection whatever bytes follow a valid preface and
// SETTINGS: it must not panic, and its goroutine and its calls must end
// once the client closes.
func FuzzConn(f *testing.F) {
	for _, s := range fuzzSeeds() {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		s := NewServer(Options{MaxConcurrentStreams: 64, MaxRecvMsgSize: 1 << 16, WriteTimeout: time.Second})
		registerTestHandlers(s, make(chan struct{}, 1024), make(chan error, 1024), make(chan struct{}))
		client, server := net.Pipe()
		c := newConn(s, server)
		s.conwg.Add(1)
		served := make(chan struct{})
		go func() { c.serve(); close(served) }()
		go io.Copy(io.Discard, client)

		wrote := make(chan struct{})
		go func() {
			defer close(wrote)
			var settings bytes.Buffer
			http2.NewFramer(&settings, nil).WriteSettings()
			if _, err := io.WriteString(client, preface); err != nil {
				return
			}
			if _, err := client.Write(settings.Bytes()); err != nil {
				return
			}
			client.Write(in)
		}()
		select {
		case <-wrote:
		case <-served:
		case <-time.After(10 * time.Second):
			t.Fatal("the server neither reads the input nor closes")
		}
		client.Close()
		select {
		case <-served:
		case <-time.After(10 * time.Second):
			t.Fatal("the connection's goroutine runs on after the client closed")
		}
		calls := make(chan struct{})
		go func() { s.calls.Wait(); close(calls) }()
		select {
		case <-calls:
		case <-time.After(10 * time.Second):
			t.Fatal("calls run on after the connection closed")
		}
	})
}
