package costmodel

import (
	"syscall"
	"testing"
)

// cpuTime returns the CPU time this process has used, user and system.
func cpuTime() int64 {
	var r syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &r); err != nil {
		return 0
	}
	return r.Utime.Nano() + r.Stime.Nano()
}

// reportCPU adds a cpu-ns/op metric: the process's CPU time per operation
// since start. Unlike ns/op (wall time) it does not grow when other
// processes share the machine, so ratios between benchmarks of one run stay
// meaningful on a loaded machine.
func reportCPU(b *testing.B, start int64) {
	b.Helper()
	if b.N > 0 {
		b.ReportMetric(float64(cpuTime()-start)/float64(b.N), "cpu-ns/op")
	}
}
