package weighted

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// Algorithm names how a limit counts. The zero value is TokenBucket.
type Algorithm uint8

const (
	// TokenBucket holds up to Burst units and refills continuously at Rate
	// units per Period. A debit of cost c takes c units if that many are
	// there.
	TokenBucket Algorithm = iota
	// GCRA is the generic cell rate algorithm (a leaky bucket used as a
	// meter): a debit of cost c is admitted when the theoretical arrival
	// time, advanced by c emission intervals (Period/Rate each), lies no
	// more than Burst emission intervals in the future. With the same Rate,
	// Period and Burst it makes exactly the decisions TokenBucket makes: it
	// is the virtual-scheduling form of the same meter, kept under its own
	// name and its own keys because configurations ask for it by name.
	GCRA
	// SlidingWindow counts the current fixed window plus the previous
	// window's count weighted by how much of it still overlaps the sliding
	// window of length Period ending now.
	SlidingWindow
	// FixedWindow counts units in windows of length Period aligned to the
	// Unix epoch, or in calendar windows (see Calendar); the count starts
	// from zero in each window.
	FixedWindow
	// SlidingLog keeps one entry per admitted debit and admits when the
	// entries of the last Period, plus the cost, fit. It is exact, and its
	// memory is one entry per admitted debit still inside the window:
	// at most Rate entries per key, because every entry holds at least one
	// unit. A denial's RetryAfter is when enough of the oldest entries
	// leave the window, read from the oldest 256 at most: when those free
	// too little, it is when the last of them leaves, sooner than the
	// exact answer (so is Concurrency's, of its oldest leases). One call
	// drops at most 1,024 entries that left the window, all its items'
	// keys together; those left over still count until later calls drop
	// them, so a log that fell that far behind refuses early, never late,
	// with a RetryAfter of 1 µs (so does Concurrency's, of its expired
	// leases).
	SlidingLog
	// Concurrency counts units in flight: a debit holds its cost until the
	// reservation is settled or cancelled, or until its lease (Period)
	// expires, so that a crashed holder cannot leak capacity. A holder
	// that runs longer renews its lease (Store.Renew).
	Concurrency

	numAlgorithms
)

var algorithmNames = [numAlgorithms]string{
	TokenBucket:   "token_bucket",
	GCRA:          "gcra",
	SlidingWindow: "sliding_window",
	FixedWindow:   "fixed_window",
	SlidingLog:    "sliding_log",
	Concurrency:   "concurrency",
}

// algorithmCodes are the short names used inside storage keys. They never
// change, so that stored state outlives renames of the public names.
var algorithmCodes = [numAlgorithms]string{
	TokenBucket:   "tb",
	GCRA:          "gcra",
	SlidingWindow: "sw",
	FixedWindow:   "fw",
	SlidingLog:    "log",
	Concurrency:   "conc",
}

// ParseAlgorithm returns the algorithm named s: "token_bucket", "gcra",
// "sliding_window", "fixed_window", "sliding_log" or "concurrency".
func ParseAlgorithm(s string) (Algorithm, error) {
	for a, name := range algorithmNames {
		if s == name {
			return Algorithm(a), nil
		}
	}
	return 0, fmt.Errorf("weighted: unknown algorithm %q (want one of %s)", s, strings.Join(algorithmNames[:], ", "))
}

// String returns the name that ParseAlgorithm accepts.
func (a Algorithm) String() string {
	if a < numAlgorithms {
		return algorithmNames[a]
	}
	return fmt.Sprintf("Algorithm(%d)", uint8(a))
}

func (a Algorithm) code() string { return algorithmCodes[a] }

// monthCode is the code inside the storage keys of a FixedWindow limit on
// calendar months, so that its windows never mix with a period's.
const monthCode = "fwm"

// code returns the code of the limit's keys: its algorithm's, or
// monthCode.
func (l *Limit) code() string {
	if l.Calendar == Month {
		return monthCode
	}
	return l.Algorithm.code()
}

// Calendar names the calendar windows of a FixedWindow limit. The zero
// value is NoCalendar.
type Calendar uint8

const (
	// NoCalendar counts in windows of length Period aligned to the Unix
	// epoch.
	NoCalendar Calendar = iota
	// Month counts in UTC calendar months: a window starts at 00:00 UTC on
	// the 1st and ends at 00:00 UTC on the 1st of the next month, 28 to 31
	// days later. A month limit has no Period.
	Month

	numCalendars
)

var calendarNames = [numCalendars]string{NoCalendar: "", Month: "month"}

// String returns the calendar's name: "month" for Month, "" for
// NoCalendar.
func (c Calendar) String() string {
	if c < numCalendars {
		return calendarNames[c]
	}
	return fmt.Sprintf("Calendar(%d)", uint8(c))
}

// Limit is one rate limit: Rate units per Period, counted by Algorithm; or,
// for a FixedWindow limit with a Calendar, Rate units per calendar window.
//
// What Burst means depends on the algorithm:
//   - TokenBucket and GCRA: the capacity, the most units that can be debited
//     at once after an idle spell; 0 means Rate. It may be smaller or larger
//     than Rate.
//   - FixedWindow, SlidingWindow and SlidingLog: the capacity is Rate units
//     per window; Burst must be 0 or equal to Rate.
//   - Concurrency: the capacity is Rate units in flight, and Period is the
//     lease after which the units of a holder that never settled (nor
//     renewed, see Store.Renew) return; Burst must be 0 or equal to Rate.
//
// Capacity bounds a single cost: a debit whose cost exceeds the capacity can
// never be admitted and is refused with a *CostError.
type Limit struct {
	// Name identifies the limit, for example "tenant-tokens". It is part of
	// every storage key and must not contain ':', '{' or '}'.
	Name      string
	Algorithm Algorithm
	// Rate is the number of units admitted per Period (Concurrency: the
	// units that may be in flight at once). It is at least 1.
	Rate int64
	// Period is the refill period or window length (Concurrency: the
	// lease). It is a whole number of microseconds, at least 1µs and at
	// most MaxPeriod; 0 for a limit with a Calendar.
	Period time.Duration
	// Burst is the capacity of TokenBucket and GCRA; see the type's
	// documentation. 0 means Rate.
	Burst int64
	// Calendar, when not NoCalendar, makes a FixedWindow limit count in
	// calendar windows (Month: UTC calendar months) instead of windows of
	// length Period; Period must then be 0. Its state is kept under keys of
	// its own, so that a limit switched between a Period and a Calendar
	// starts from empty windows. Only FixedWindow takes a Calendar.
	Calendar Calendar
	// Lease, when its Max is positive, lets a Leased store spend slices of
	// this limit's allowance in process (see Leased). The zero value is
	// strict: every debit goes to the store. Other stores ignore it.
	Lease Lease
}

// MaxPeriod is the longest Period a limit may have.
const MaxPeriod = 400 * 24 * time.Hour

// maxRefill is the longest a token bucket or GCRA may take to repay its
// most debt, two capacities (see spec.maxDebt), in µs: 2^51 µs, about 71
// years. A time plus a refill then stays below 2^53 µs (until the year
// 2183), exact in the scripts' doubles, a refill in ms is an integer that
// Redis accepts as a PX, and a refill fits a time.Duration.
const maxRefill = 1 << 51

// maxScaled bounds every product the algorithms form, so that the Lua
// scripts, whose numbers are IEEE doubles exact to 2^53, compute exactly what
// the Go code computes with int64: sums of a few such values stay below 2^53.
const maxScaled = 1 << 50

// Capacity returns the most units the limit can hold at once: Burst for
// TokenBucket and GCRA when it is set, else Rate.
func (l Limit) Capacity() int64 {
	if (l.Algorithm == TokenBucket || l.Algorithm == GCRA) && l.Burst > 0 {
		return l.Burst
	}
	return l.Rate
}

// KeyLife bounds how long a store keeps a key of the limit after a debit,
// a settlement or a renewal writes it: a token bucket or GCRA until it has
// repaid its most debt (two capacities: ceil(2 x capacity / Rate)
// periods), a fixed window until its window ends (Period; a calendar
// month, 31 days), a sliding window until the window after it ends (two
// periods), a sliding log or a concurrency limit until its newest mark
// leaves (Period), each with the store's slack (the period, at most a
// minute) and a second for rounding; a leased limit's lease index lives
// two lease lives and a period more. A caller that counts a store's keys
// (one per key it passed in an Item) may forget a key KeyLife after its
// last write. The limit must be valid.
func (l Limit) KeyLife() time.Duration {
	slack := min(l.Period, time.Minute) + time.Second
	period := l.Period
	switch {
	case l.Calendar != NoCalendar:
		period, slack = time.Duration(maxMonth)*time.Microsecond, time.Minute+time.Second
	case l.Algorithm == TokenBucket || l.Algorithm == GCRA:
		// At most maxRefill µs, which a Duration holds (Validate).
		period *= time.Duration(ceilDiv(2*l.Capacity(), max(l.Rate, 1)))
	case l.Algorithm == SlidingWindow:
		period *= 2
	}
	life := period + slack
	if l.Lease.On() {
		life += 2*l.Lease.Life() + l.Period
	}
	return life
}

// String describes the limit, for example "tenant-tokens: token_bucket
// 1000/1m0s burst 2000" or "budget: fixed_window 500/month".
func (l Limit) String() string {
	var s string
	if l.Calendar != NoCalendar {
		s = fmt.Sprintf("%s: %s %d/%s", l.Name, l.Algorithm, l.Rate, l.Calendar)
	} else {
		s = fmt.Sprintf("%s: %s %d/%s", l.Name, l.Algorithm, l.Rate, l.Period)
	}
	if l.Burst > 0 && l.Burst != l.Rate {
		s += fmt.Sprintf(" burst %d", l.Burst)
	}
	return s
}

// Validate reports whether the limit can be enforced exactly.
//
// Besides the bounds on each field, the algorithms that refill or weigh by
// elapsed time (TokenBucket, GCRA, SlidingWindow) count time in ticks: the
// smallest power of ten microseconds that divides Period and keeps
// capacity × (Period / tick) and Rate × (Period / tick) at most 2^50. A
// limit of 10^11 units a day, for example, refills every 10 s; a limit for
// which no such tick exists is invalid. A TokenBucket or GCRA must also
// repay a debt of two capacities (what a settlement may charge, see Store)
// within about 71 years (2^51 µs): ceil(2 × capacity / Rate) periods at
// most.
func (l Limit) Validate() error {
	_, err := l.spec()
	return err
}

// spec is a validated limit in the integer form the algorithms compute with.
// Times are in microseconds.
type spec struct {
	algo   Algorithm
	cal    Calendar // FixedWindow only; period is then maxMonth
	cap    int64    // capacity, units
	rate   int64    // units per period
	period int64    // µs
	tick   int64    // µs; divides period
	p      int64    // ticks per period
	// trims is how many more marks that stopped counting the call may
	// drop (see maxTrim), shared by the items of one call; nil: maxTrim
	// for each read of a key.
	trims *int
}

func (l Limit) spec() (spec, error) {
	bad := func(format string, args ...any) (spec, error) {
		return spec{}, fmt.Errorf("weighted: limit %q: "+format, append([]any{l.Name}, args...)...)
	}
	switch {
	case l.Name == "":
		return bad("empty name")
	case !validName(l.Name):
		return bad("name must not contain ':', '{' or '}'")
	case l.Algorithm >= numAlgorithms:
		return bad("unknown algorithm %d", uint8(l.Algorithm))
	case l.Rate < 1:
		return bad("rate %d is not positive", l.Rate)
	case l.Rate > maxScaled:
		return bad("rate %d exceeds 2^50", l.Rate)
	case l.Calendar != NoCalendar:
		return l.calendarSpec(bad)
	case l.Period < time.Microsecond || l.Period > MaxPeriod:
		return bad("period %s is not between 1µs and %s", l.Period, MaxPeriod)
	case l.Period%time.Microsecond != 0:
		return bad("period %s is not a whole number of microseconds", l.Period)
	case l.Burst < 0:
		return bad("burst %d is negative", l.Burst)
	case l.Burst > maxScaled:
		return bad("burst %d exceeds 2^50", l.Burst)
	}
	s := spec{algo: l.Algorithm, cap: l.Capacity(), rate: l.Rate, period: l.Period.Microseconds()}
	if err := l.Lease.check(l.Algorithm, s.cap); err != nil {
		return bad("%v", err)
	}
	if l.Algorithm != TokenBucket && l.Algorithm != GCRA && l.Burst != 0 && l.Burst != l.Rate {
		return bad("burst %d does not apply to %s (leave it 0; the capacity is the rate)", l.Burst, l.Algorithm)
	}
	if (l.Algorithm == TokenBucket || l.Algorithm == GCRA) && ceilDiv(2*s.cap, s.rate) > maxRefill/s.period {
		return bad("capacity %d refills too slowly at %d per %s: repaying a debt of two capacities takes %d periods, more than 2^51µs (about 71 years)", s.cap, s.rate, l.Period, ceilDiv(2*s.cap, s.rate))
	}
	if !s.timed() {
		s.tick, s.p = s.period, 1
		return s, nil
	}
	for tick := int64(1); tick <= s.period; tick *= 10 {
		if s.period%tick != 0 {
			break
		}
		p := s.period / tick
		if s.cap <= maxScaled/p && s.rate <= maxScaled/p {
			s.tick, s.p = tick, p
			return s, nil
		}
	}
	return bad("rate %d and capacity %d are too large for period %s to be counted exactly", l.Rate, s.cap, l.Period)
}

// maxMonth is the longest calendar month in µs: a month limit's spec
// period, which bounds its expiry's slack as a period does.
const maxMonth = 31 * 24 * int64(time.Hour/time.Microsecond)

// calendarSpec validates a limit with a Calendar, whose name and rate are
// valid.
func (l Limit) calendarSpec(bad func(string, ...any) (spec, error)) (spec, error) {
	switch {
	case l.Calendar >= numCalendars:
		return bad("unknown calendar %d", uint8(l.Calendar))
	case l.Algorithm != FixedWindow:
		return bad("calendar %s applies only to %s, not %s", l.Calendar, FixedWindow, l.Algorithm)
	case l.Period != 0:
		return bad("period %s with calendar %s (leave it 0; the window is the calendar's)", l.Period, l.Calendar)
	case l.Burst < 0:
		return bad("burst %d is negative", l.Burst)
	case l.Burst != 0 && l.Burst != l.Rate:
		return bad("burst %d does not apply to %s (leave it 0; the capacity is the rate)", l.Burst, l.Algorithm)
	}
	if err := l.Lease.check(l.Algorithm, l.Rate); err != nil {
		return bad("%v", err)
	}
	return spec{algo: FixedWindow, cal: l.Calendar, cap: l.Rate, rate: l.Rate, period: maxMonth, tick: maxMonth, p: 1}, nil
}

// validName reports whether name has none of ':', '{' and '}'. It is
// spelled out because it runs on every debit.
func validName(name string) bool {
	for i := 0; i < len(name); i++ {
		if c := name[i]; c == ':' || c == '{' || c == '}' {
			return false
		}
	}
	return true
}

// timed reports whether the algorithm counts elapsed time in ticks.
func (s spec) timed() bool {
	return s.algo == TokenBucket || s.algo == GCRA || s.algo == SlidingWindow
}

// Item is one limit to debit in a request.
type Item struct {
	Limit Limit
	// Key is the key of this limit for this request, for example
	// "tenant=acme" or "{acme}:model=gpt-4o". The store prefixes it with its
	// own prefix, the limit's name and algorithm.
	//
	// Redis Cluster: items are debited together, in one script, when their
	// keys share a hash tag. A key's hash tag is the text between its first
	// '{' and the next '}' when that text is not empty (Redis's own rule);
	// a key without one is its own tag, so every limit on "tenant=acme"
	// shares a slot. Give the keys of one scope the same tag, for example
	// "{acme}:model=gpt-4o" beside "{acme}".
	Key string
	// Cost is what the request costs in the limit's unit. It is at least 0
	// and at most the limit's capacity.
	Cost int64
	// Final says that the debit's cost is final: the caller will neither
	// settle nor cancel it (an Envoy rate limit decision). When every item
	// of a debit is Final, the store keeps the record by which a window
	// refunds into the window debited (fixed and sliding windows) for
	// FinalRecordTTL, long enough for the store's own compensation of a
	// debit that fails part way, instead of until the window ends; a
	// Settle or Cancel after that refunds nothing into a window. Other
	// algorithms keep no such record; a concurrency limit's units are held
	// until settled or cancelled, Final or not.
	Final bool
}

// ErrCostExceedsCapacity is the sentinel of a *CostError: a cost that no
// state of the limit could ever admit.
var ErrCostExceedsCapacity = errors.New("weighted: cost exceeds capacity")

// CostError reports a debit whose cost exceeds a limit's capacity. It
// matches ErrCostExceedsCapacity under errors.Is.
type CostError struct {
	Limit    string // the limit's name
	Cost     int64
	Capacity int64
}

func (e *CostError) Error() string {
	return fmt.Sprintf("weighted: limit %q: cost %d exceeds capacity %d", e.Limit, e.Cost, e.Capacity)
}

// Unwrap returns ErrCostExceedsCapacity.
func (e *CostError) Unwrap() error { return ErrCostExceedsCapacity }

// ErrDuplicateItem is returned when one request names the same limit and key
// twice: all-or-nothing needs each key once.
var ErrDuplicateItem = errors.New("weighted: the same limit and key appear twice")

// specs validates items for a debit or peek and returns their specs. When
// checkCost is set, a cost above capacity is a *CostError.
func specs(items []Item, buf []spec, checkCost bool) ([]spec, error) {
	out := buf[:0]
	for i := range items {
		it := &items[i]
		s, err := it.Limit.spec()
		if err != nil {
			return nil, err
		}
		if it.Cost < 0 {
			return nil, fmt.Errorf("%w: limit %q: negative cost %d", ErrInvalidCost, it.Limit.Name, it.Cost)
		}
		if checkCost && it.Cost > s.cap {
			return nil, &CostError{Limit: it.Limit.Name, Cost: it.Cost, Capacity: s.cap}
		}
		for j := 0; j < i; j++ {
			o := &items[j]
			if o.Key == it.Key && o.Limit.Name == it.Limit.Name && o.Limit.Algorithm == it.Limit.Algorithm && o.Limit.Calendar == it.Limit.Calendar {
				return nil, fmt.Errorf("%w: %q key %q", ErrDuplicateItem, it.Limit.Name, it.Key)
			}
		}
		out = append(out, s)
	}
	return out, nil
}
