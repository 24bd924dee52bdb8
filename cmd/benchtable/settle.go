package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// Before each benchmark the machine is let settle: what the one before
// left running (servers shutting down, the kernel writing their files
// back, daemons exiting) would otherwise be measured as the next one's
// cost. settle waits until the machine's CPUs have been busy less than
// settleBusy of the time over settleQuiet, for at most settleFor, and
// says how long it waited and how busy the machine still was.
const (
	settleBusy  = 0.10
	settleQuiet = 2 * time.Second
	settleFor   = 60 * time.Second
	settleTick  = 500 * time.Millisecond
)

// cpuTimes are /proc/stat's first line: the jiffies all CPUs spent, and
// those they spent idle (idle and iowait).
type cpuTimes struct{ total, idle uint64 }

func readCPUTimes() (cpuTimes, bool) {
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		return cpuTimes{}, false
	}
	line, _, _ := strings.Cut(string(data), "\n")
	f := strings.Fields(line)
	if len(f) < 6 || f[0] != "cpu" {
		return cpuTimes{}, false
	}
	var t cpuTimes
	for i, v := range f[1:] {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return cpuTimes{}, false
		}
		if i == 7 || i == 8 { // guest time is counted in user time already
			continue
		}
		t.total += n
		if i == 3 || i == 4 {
			t.idle += n
		}
	}
	return t, true
}

// busy is the share of the CPUs' time from a to b spent not idle.
func busy(a, b cpuTimes) float64 {
	total := b.total - a.total
	if total == 0 {
		return 0
	}
	return 1 - float64(b.idle-a.idle)/float64(total)
}

// quiet reports whether samples, a tick apart, have the machine busy less
// than settleBusy over the last settleQuiet, and how busy it was.
func quiet(samples []cpuTimes) (bool, float64) {
	n := int(settleQuiet / settleTick)
	if len(samples) <= n {
		return false, 1
	}
	b := busy(samples[len(samples)-1-n], samples[len(samples)-1])
	return b < settleBusy, b
}

// settle waits for the machine to be quiet (see above) and returns what it
// found, for the log.
func settle(ctx context.Context) string {
	began := time.Now()
	var samples []cpuTimes
	b := 1.0
	for {
		t, ok := readCPUTimes()
		if !ok {
			return "no /proc/stat: not waited for"
		}
		samples = append(samples, t)
		var ok2 bool
		if ok2, b = quiet(samples); ok2 {
			return fmt.Sprintf("quiet after %s (CPUs %.0f %% busy)", time.Since(began).Round(100*time.Millisecond), 100*b)
		}
		if time.Since(began) >= settleFor {
			return fmt.Sprintf("still %.0f %% busy after %s: measured anyway", 100*b, settleFor)
		}
		select {
		case <-ctx.Done():
			return "cancelled"
		case <-time.After(settleTick):
		}
	}
}
