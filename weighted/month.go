package weighted

import "time"

// Calendar months. A FixedWindow limit with Calendar Month counts in UTC
// calendar months: its window index is the month's year × 12 + month - 1
// (January 2026 is 24312), its window starts at the first µs of the month
// and ends at the first µs of the next. Its state is a fixed window's (w,
// curr) with wp = -1 in place of a period, under keys of their own (code
// fwm), so that it is never carried to or from a period's windows. A clock
// behind the state's month keeps counting in that month, as a fixed
// window's does. lib.lua computes the same months with Howard Hinnant's
// civil-from-days and days-from-civil arithmetic on doubles, which
// TestMonthArithmetic checks against the time package.

// monthWP is what a month window keeps in place of its period.
const monthWP = -1

// monthIndex returns the index of the UTC month holding t (µs since the
// Unix epoch).
func monthIndex(t int64) int64 {
	y, m, _ := time.UnixMicro(t).UTC().Date()
	return int64(y)*12 + int64(m) - 1
}

// monthStart returns the first µs of the month of index w.
func monthStart(w int64) int64 {
	y, m := w/12, w%12
	if m < 0 {
		y, m = y-1, m+12
	}
	return time.Date(int(y), time.Month(m+1), 1, 0, 0, 0, 0, time.UTC).UnixMicro()
}

// monthAt returns the month counted in at now, its count, and its start
// and end (µs). A clock behind the state's month keeps counting in it.
func monthAt(st *state, now int64) (w, curr, start, end int64) {
	w = monthIndex(now)
	if st.w > w && st.curr > 0 {
		w = st.w
	}
	if st.w == w {
		curr = st.curr
	}
	return w, curr, monthStart(w), monthStart(w + 1)
}

func (s *spec) debitMonth(st *state, now, cost int64) int64 {
	w, curr, _, end := monthAt(st, now)
	st.w, st.prev, st.curr, st.wp = w, 0, curr+cost, monthWP
	return end - now
}

// settleMonth settles as settleWindow does: a refund goes only into the
// month that was debited, the month of rec.
func (s *spec) settleMonth(st *state, now, delta, rec int64) int64 {
	w, curr, _, end := monthAt(st, now)
	switch {
	case delta > 0:
		curr = min(curr+delta, s.cap)
	case delta < 0 && rec >= 0 && monthIndex(rec) == w:
		curr = max(curr+delta, 0)
	}
	st.w, st.prev, st.curr, st.wp = w, 0, curr, monthWP
	if curr == 0 {
		return 0
	}
	return end - now
}
