package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"
)

// clockTick is USER_HZ, the unit of utime and stime in /proc/PID/stat. It is
// 100 on every Linux architecture Go supports (sysconf(_SC_CLK_TCK) needs
// cgo to ask).
const clockTick = 10 * time.Millisecond

// cpuSample is the CPU time a process had used at one instant, read two ways.
type cpuSample struct {
	// Sched is the sum over the process's live threads of the first field
	// of /proc/PID/task/TID/schedstat: time on a CPU, in nanoseconds. A
	// thread that exits between two samples takes its time with it; Go
	// runtimes rarely end threads, so this is the precise figure.
	Sched time.Duration
	// Stat is utime+stime of /proc/PID/stat, in clock ticks of 10 ms,
	// exited threads included: the coarse cross-check.
	Stat time.Duration
}

// readCPU samples the CPU time of process pid.
func readCPU(pid int) (cpuSample, error) {
	var s cpuSample
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return s, fmt.Errorf("cpu: %w", err)
	}
	// The command name (field 2) is in parentheses and may hold spaces:
	// fields are counted after its closing one. utime and stime are fields
	// 14 and 15, so the 12th and 13th after it.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return s, fmt.Errorf("cpu: /proc/%d/stat: no command name", pid)
	}
	fields := bytes.Fields(b[i+1:])
	if len(fields) < 13 {
		return s, fmt.Errorf("cpu: /proc/%d/stat: %d fields after the name, want at least 13", pid, len(fields))
	}
	for _, f := range fields[11:13] {
		n, err := strconv.ParseInt(string(f), 10, 64)
		if err != nil {
			return s, fmt.Errorf("cpu: /proc/%d/stat: %w", pid, err)
		}
		s.Stat += time.Duration(n) * clockTick
	}

	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/schedstat", pid))
	if err != nil || len(tasks) == 0 {
		return s, fmt.Errorf("cpu: no /proc/%d/task/*/schedstat", pid)
	}
	for _, t := range tasks {
		b, err := os.ReadFile(t)
		if err != nil {
			continue // the thread ended since the glob
		}
		f := bytes.Fields(b)
		if len(f) == 0 {
			continue
		}
		n, err := strconv.ParseInt(string(f[0]), 10, 64)
		if err != nil {
			return s, fmt.Errorf("cpu: %s: %w", t, err)
		}
		s.Sched += time.Duration(n)
	}
	return s, nil
}

// sub is the CPU time used between sample o and sample s.
func (s cpuSample) sub(o cpuSample) cpuSample {
	return cpuSample{Sched: s.Sched - o.Sched, Stat: s.Stat - o.Stat}
}
