// truth.go: a Go CPU burner with a known split, for checking Go frames in a profile against the
// truth (Go 1.16 on, standard library only).
//
//	main.main -> main.middleLevel -> main.hotLoop   (about 70%; frameless: no locals, no calls)
//	                              -> main.coldLoop  (about 30%; has a stack frame)
//
// Each cycle burns a chunk in hotLoop, then one in coldLoop; chunk lengths are jittered
// (+-75%) so that the cycle cannot alias with a sampling period. The main goroutine is locked
// to its thread, and the truth is measured, not assumed: middleLevel adds the thread CPU time
// (CLOCK_THREAD_CPUTIME_ID) of each leaf call to that leaf's total.
//
// Until it gets SIGUSR1 it burns in main.warmup instead (the test sends it once the profiler is
// ready to unwind this binary), so the measured cycles are the steady state only.
//
// Usage: truth SECONDS. Prints {"ready":true,"pid":N} at start, and at the end (after SECONDS
// of wall time, or on SIGTERM) one JSON line with each leaf's share of the two totals, e.g.
// {"hot":0.7012,"cold":0.2988,"cycles":9000}.
package main

import (
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"
)

var (
	sink    uint64
	hotNs   int64
	coldNs  int64
	stopped int32
	started int32
)

// threadCPU is this thread's CPU time in nanoseconds.
func threadCPU() int64 {
	var ts syscall.Timespec
	// CLOCK_THREAD_CPUTIME_ID = 3
	syscall.Syscall(syscall.SYS_CLOCK_GETTIME, 3, uintptr(unsafe.Pointer(&ts)), 0)
	return ts.Sec*1e9 + ts.Nsec
}

//go:noinline
func hotLoop(n int, x uint64) uint64 {
	for i := 0; i < n; i++ {
		x = x*6364136223846793005 + 1442695040888963407
		x ^= x >> 29
	}
	return x
}

//go:noinline
func coldLoop(n int, x uint64) uint64 {
	var buf [16]uint64
	for i := 0; i < n; i++ {
		j := i & 15
		buf[j] = buf[(j+7)&15]*6364136223846793005 + x
		x ^= buf[j] >> 31
	}
	return x ^ buf[3]
}

//go:noinline
func middleLevel(unit int, rng *uint64) {
	*rng = *rng*6364136223846793005 + 1
	jitter := func() float64 { *rng = *rng*6364136223846793005 + 1; return 0.25 + 1.5*float64(*rng>>11)/float64(1<<53) }
	t0 := threadCPU()
	sink += hotLoop(int(7*float64(unit)*jitter()), sink)
	t1 := threadCPU()
	sink += coldLoop(int(3*float64(unit)*jitter()), sink)
	t2 := threadCPU()
	hotNs += t1 - t0
	coldNs += t2 - t1
}

//go:noinline
func warmup(n int, x uint64) uint64 {
	for i := 0; i < n; i++ {
		x = x*2862933555777941757 + 3037000493
	}
	return x
}

// calibrate: iterations of hotLoop in about 100 us of CPU.
func calibrate() int {
	n := 100000
	start := threadCPU()
	sink += hotLoop(n, sink)
	spent := threadCPU() - start
	if spent <= 0 {
		spent = 1
	}
	unit := int(int64(n) * 100000 / spent)
	if unit < 1000 {
		unit = 1000
	}
	return unit
}

func main() {
	runtime.LockOSThread()
	seconds := 60
	if len(os.Args) > 1 {
		if s, err := strconv.Atoi(os.Args[1]); err == nil {
			seconds = s
		}
	}
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT)
	go func() { <-signals; atomic.StoreInt32(&stopped, 1) }()
	start := make(chan os.Signal, 1)
	signal.Notify(start, syscall.SIGUSR1)
	go func() { <-start; atomic.StoreInt32(&started, 1) }()
	unit := calibrate()
	fmt.Printf("{\"ready\":true,\"pid\":%d}\n", os.Getpid())
	end := time.Now().Add(time.Duration(seconds) * time.Second)
	for atomic.LoadInt32(&stopped) == 0 && atomic.LoadInt32(&started) == 0 && time.Now().Before(end) {
		sink += warmup(unit, sink)
	}
	rng := uint64(os.Getpid())
	cycles := 0
	for atomic.LoadInt32(&stopped) == 0 && time.Now().Before(end) {
		middleLevel(unit, &rng)
		cycles++
	}
	total := float64(hotNs + coldNs)
	if total <= 0 {
		total = 1
	}
	fmt.Printf("{\"hot\":%.4f,\"cold\":%.4f,\"cycles\":%d}\n", float64(hotNs)/total, float64(coldNs)/total, cycles)
}
