package telemetry

// The hot-path instruments (every counter and histogram) are not SDK
// instruments: the OpenTelemetry SDK's synchronous Add and Record cost about
// 115 ns of CPU each here (a third of it normalising the attribute set on
// every call), and a request makes fifteen of them: 1.7 µs against about
// 0.36 µs for the cells (BenchmarkRequest, figures in bench/README.md). Instead each data point is a
// cell of atomic counters, resolved once per label combination and cached;
// recording is a bucket search and two atomic adds. At collection time a
// metric Producer turns the cells into OpenTelemetry metric data, which the
// Prometheus exporter and the OTLP reader handle like their own. The data is
// cumulative, from New to the collection.

import (
	"context"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/instrumentation"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// sumCell is one data point of a monotonic int64 counter.
type sumCell struct {
	attrs attribute.Set
	v     atomic.Int64
}

func (c *sumCell) add(n int64) { c.v.Add(n) }

// sumFamily is a counter: its cells, one per attribute set.
type sumFamily struct {
	name, unit, desc string
	mu               sync.Mutex
	cells            []*sumCell
}

// cell registers and returns a new cell. Callers cache it: calling cell twice
// with the same attributes would report two points with one attribute set.
func (f *sumFamily) cell(kv ...attribute.KeyValue) *sumCell {
	c := &sumCell{attrs: attribute.NewSet(kv...)}
	f.mu.Lock()
	f.cells = append(f.cells, c)
	f.mu.Unlock()
	return c
}

func (f *sumFamily) collect(start, now time.Time) metricdata.Metrics {
	f.mu.Lock()
	cells := f.cells[:len(f.cells):len(f.cells)]
	f.mu.Unlock()
	pts := make([]metricdata.DataPoint[int64], 0, len(cells))
	for _, c := range cells {
		pts = append(pts, metricdata.DataPoint[int64]{Attributes: c.attrs, StartTime: start, Time: now, Value: c.v.Load()})
	}
	return metricdata.Metrics{
		Name: f.name, Unit: f.unit, Description: f.desc,
		Data: metricdata.Sum[int64]{DataPoints: pts, Temporality: metricdata.CumulativeTemporality, IsMonotonic: true},
	}
}

// histCell is one data point of an explicit-bucket histogram over int64
// values (nanoseconds or tokens). Bucket i counts values v with
// bounds[i-1] < v <= bounds[i]; the last bucket is everything above.
type histCell struct {
	attrs  attribute.Set
	bounds []int64
	counts []atomic.Uint64
	sum    atomic.Int64
}

func (c *histCell) record(v int64) {
	// Binary search for the first bound >= v.
	lo, hi := 0, len(c.bounds)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if c.bounds[m] < v {
			lo = m + 1
		} else {
			hi = m
		}
	}
	c.counts[lo].Add(1)
	c.sum.Add(v)
}

// histFamily is a histogram. Values are recorded as int64 in a base unit and
// exported multiplied by scale (1e-9 turns nanoseconds into seconds); a
// family with scale 1 is exported as an int64 histogram.
type histFamily struct {
	name, unit, desc string
	bounds           []float64 // exported bounds, in the exported unit
	ibounds          []int64   // the same bounds in the recorded unit
	scale            float64
	mu               sync.Mutex
	cells            []*histCell
}

func newHistFamily(name, unit, desc string, bounds []float64, scale float64) *histFamily {
	f := &histFamily{name: name, unit: unit, desc: desc, bounds: bounds, scale: scale}
	for _, b := range bounds {
		f.ibounds = append(f.ibounds, int64(math.Round(b/scale)))
	}
	return f
}

func (f *histFamily) cell(kv ...attribute.KeyValue) *histCell {
	c := &histCell{attrs: attribute.NewSet(kv...), bounds: f.ibounds, counts: make([]atomic.Uint64, len(f.ibounds)+1)}
	f.mu.Lock()
	f.cells = append(f.cells, c)
	f.mu.Unlock()
	return c
}

func (f *histFamily) collect(start, now time.Time) metricdata.Metrics {
	f.mu.Lock()
	cells := f.cells[:len(f.cells):len(f.cells)]
	f.mu.Unlock()
	point := func(c *histCell) (uint64, []uint64, int64) {
		counts := make([]uint64, len(c.counts))
		var n uint64
		for i := range c.counts {
			counts[i] = c.counts[i].Load()
			n += counts[i]
		}
		// Count is the sum of the buckets read, so the exposition stays
		// consistent (+Inf equals _count) under concurrent recording.
		return n, counts, c.sum.Load()
	}
	m := metricdata.Metrics{Name: f.name, Unit: f.unit, Description: f.desc}
	if f.scale == 1 {
		pts := make([]metricdata.HistogramDataPoint[int64], 0, len(cells))
		for _, c := range cells {
			n, counts, sum := point(c)
			pts = append(pts, metricdata.HistogramDataPoint[int64]{
				Attributes: c.attrs, StartTime: start, Time: now, Count: n, Bounds: f.bounds, BucketCounts: counts, Sum: sum,
			})
		}
		m.Data = metricdata.Histogram[int64]{DataPoints: pts, Temporality: metricdata.CumulativeTemporality}
		return m
	}
	pts := make([]metricdata.HistogramDataPoint[float64], 0, len(cells))
	for _, c := range cells {
		n, counts, sum := point(c)
		pts = append(pts, metricdata.HistogramDataPoint[float64]{
			Attributes: c.attrs, StartTime: start, Time: now, Count: n, Bounds: f.bounds, BucketCounts: counts, Sum: float64(sum) * f.scale,
		})
	}
	m.Data = metricdata.Histogram[float64]{DataPoints: pts, Temporality: metricdata.CumulativeTemporality}
	return m
}

// producer hands the cells to the metric readers. It is safe for concurrent
// use.
type producer struct {
	start time.Time
	sums  []*sumFamily
	hists []*histFamily
}

func (p *producer) Produce(context.Context) ([]metricdata.ScopeMetrics, error) {
	now := time.Now()
	ms := make([]metricdata.Metrics, 0, len(p.sums)+len(p.hists))
	for _, f := range p.sums {
		ms = append(ms, f.collect(p.start, now))
	}
	for _, f := range p.hists {
		ms = append(ms, f.collect(p.start, now))
	}
	return []metricdata.ScopeMetrics{{Scope: instrumentation.Scope{Name: scope}, Metrics: ms}}, nil
}

// lazy holds one value per small integer id, built on first use by build,
// exactly once. Lookups are a single atomic load.
type lazy[V any] struct {
	mu    sync.Mutex
	ps    []atomic.Pointer[V]
	build func(id int) *V
}

func newLazy[V any](n int, build func(int) *V) *lazy[V] {
	return &lazy[V]{ps: make([]atomic.Pointer[V], n), build: build}
}

func (l *lazy[V]) get(id int) *V {
	if p := l.ps[id].Load(); p != nil {
		return p
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if p := l.ps[id].Load(); p != nil {
		return p
	}
	p := l.build(id)
	l.ps[id].Store(p)
	return p
}
