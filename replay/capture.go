package replay

// The capture writer. The request path hands a record to a buffered channel
// and returns: it never encodes, writes or waits. When the channel is full,
// the record is dropped and counted. One goroutine encodes the records
// (encode.go), writes them to the current file through a 64 KiB buffer,
// flushed when full, every second and at Close, and rotates files at
// MaxBytes, keeping MaxFiles.

import (
	"bufio"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/costgate/costgate/policies"
)

// WriterConfig tunes a Writer.
type WriterConfig struct {
	// Dir holds the capture files; it is created when missing. Required.
	Dir string
	// Sample is the share of requests recorded, in (0, 1]; 0 means 1.
	Sample float64
	// MaxBytes is the size at which a file is closed and the next started,
	// in bytes. Default 64 MiB.
	MaxBytes int64
	// MaxFiles is how many files are kept, the current one included; the
	// oldest are removed. Default 8.
	MaxFiles int
	// Queue is how many records may wait for the writer before new ones
	// are dropped. Default 8192.
	Queue int
	// Logf receives the writer's errors; nil logs nowhere.
	Logf func(format string, args ...any)
}

// Writer records captured requests to the capture files of a directory. It
// is safe for concurrent use; Capture never blocks. Open starts its
// goroutine and Close stops it, after writing what was queued.
type Writer struct {
	cfg     WriterConfig
	ch      chan pending
	done    chan struct{}
	stopped chan struct{}
	closed  atomic.Bool
	written atomic.Int64
	dropped atomic.Int64

	// Owned by the writer's goroutine.
	f    *os.File
	bw   *bufio.Writer
	size int64
	seq  int
	line []byte // the record being written
	err  error  // the last write error, returned by Close
}

// pending is a record on its way to the writer: the input is encoded
// there, not on the request path.
type pending struct {
	id string
	in *policies.Input
	d  Taken
}

// Open starts a Writer on cfg.Dir.
func Open(cfg WriterConfig) (*Writer, error) {
	if cfg.Dir == "" {
		return nil, errors.New("replay: capture directory required")
	}
	if cfg.Sample <= 0 || cfg.Sample > 1 {
		cfg.Sample = 1
	}
	if cfg.MaxBytes <= 0 {
		cfg.MaxBytes = 64 << 20
	}
	if cfg.MaxFiles <= 0 {
		cfg.MaxFiles = 8
	}
	if cfg.Queue <= 0 {
		cfg.Queue = 8192
	}
	if cfg.Logf == nil {
		cfg.Logf = func(string, ...any) {}
	}
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("replay: capture directory: %w", err)
	}
	w := &Writer{cfg: cfg, ch: make(chan pending, cfg.Queue), done: make(chan struct{}), stopped: make(chan struct{})}
	if err := w.rotate(); err != nil {
		return nil, err
	}
	go w.loop()
	return w, nil
}

// Capture queues the request id with the policy input it was decided on
// and the decision taken, subject to sampling. It does not block: when the
// queue is full, or the Writer closed, the record is dropped and counted.
// in must not be modified afterwards.
func (w *Writer) Capture(id string, in *policies.Input, d *policies.Decision) {
	if w.cfg.Sample < 1 && rand.Float64() >= w.cfg.Sample {
		return
	}
	if w.closed.Load() {
		w.dropped.Add(1)
		return
	}
	select {
	case w.ch <- pending{id: id, in: in, d: TakenOf(d)}:
	default:
		w.dropped.Add(1)
	}
}

// Stats counts the records written and dropped since Open.
func (w *Writer) Stats() (written, dropped int64) {
	return w.written.Load(), w.dropped.Load()
}

// Close writes the records queued, flushes and closes the current file. It
// returns the last write error, if any. Close is idempotent.
func (w *Writer) Close() error {
	if w.closed.Swap(true) {
		<-w.stopped
		return nil
	}
	close(w.done)
	<-w.stopped
	return w.err
}

// flushEvery is how often the writer flushes what it buffered: a crash
// loses at most this much of the capture.
const flushEvery = time.Second

func (w *Writer) loop() {
	defer close(w.stopped)
	tick := time.NewTicker(flushEvery)
	defer tick.Stop()
	for {
		select {
		case p := <-w.ch:
			w.write(p)
		case <-tick.C:
			w.flush()
		case <-w.done:
			w.drain()
			w.flush()
			if w.f != nil {
				if err := w.f.Close(); err != nil {
					w.fail(err)
				}
			}
			return
		}
	}
}

// drain writes what is queued, without waiting for more.
func (w *Writer) drain() {
	for {
		select {
		case p := <-w.ch:
			w.write(p)
		default:
			return
		}
	}
}

func (w *Writer) write(p pending) {
	b := append(appendRecord(w.line[:0], p.id, p.in, &p.d), '\n')
	if len(b) > maxLine {
		// A record longer than readers take would fail every replay of
		// the file; nor is its buffer kept.
		w.line = nil
		w.dropped.Add(1)
		w.cfg.Logf("capture: request %s: a record of %d bytes is longer than %d; dropped", p.id, len(b), maxLine)
		return
	}
	w.line = b
	if w.f == nil || w.size+int64(len(b)) > w.cfg.MaxBytes && w.size > int64(len(header)) {
		if err := w.rotate(); err != nil {
			w.dropped.Add(1)
			w.fail(err)
			return
		}
	}
	if _, err := w.bw.Write(b); err != nil {
		w.dropped.Add(1)
		w.fail(err)
		w.abandon()
		return
	}
	w.size += int64(len(b))
	w.written.Add(1)
}

func (w *Writer) flush() {
	if w.bw != nil {
		if err := w.bw.Flush(); err != nil {
			w.fail(err)
			w.abandon()
		}
	}
}

// abandon closes the current file after a failed write: a bufio.Writer's
// error is sticky, so the next record starts a new file. The file left
// may end in a record cut short, which readers skip.
func (w *Writer) abandon() {
	if w.f != nil {
		w.f.Close()
	}
	w.f, w.bw = nil, nil
}

func (w *Writer) fail(err error) {
	w.err = fmt.Errorf("replay: capture: %w", err)
	w.cfg.Logf("capture: %v", err)
}

// rotate closes the current file, starts the next and removes the oldest
// files beyond MaxFiles.
func (w *Writer) rotate() error {
	if w.f != nil {
		w.flush()
		w.f.Close()
		w.f, w.bw = nil, nil
	}
	w.seq++
	name := fmt.Sprintf("capture-%s-%06d.jsonl", time.Now().UTC().Format("20060102T150405.000000000Z"), w.seq)
	f, err := os.OpenFile(filepath.Join(w.cfg.Dir, name), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("replay: capture file: %w", err)
	}
	w.f, w.bw = f, bufio.NewWriterSize(f, 64<<10)
	if _, err := w.bw.Write(header); err != nil {
		return fmt.Errorf("replay: capture file: %w", err)
	}
	w.size = int64(len(header))
	files, err := Files(w.cfg.Dir)
	if err != nil {
		return err
	}
	for len(files) > w.cfg.MaxFiles {
		if err := os.Remove(files[0]); err != nil {
			return fmt.Errorf("replay: remove old capture file: %w", err)
		}
		files = files[1:]
	}
	return nil
}
