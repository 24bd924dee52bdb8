package main

import (
	"crypto/sha256"
	"fmt"
	"io"
	"net"
	"time"
)

// HostSpeed is what a fixed piece of work took on the machine, probed at
// the start and at the end of a run: the same code measured on the same
// kind of machine has given figures twice as good on one day as on
// another (a cloud host's neighbours), and a run's figures can only be
// read against another run's beside its host's speed.
type HostSpeed struct {
	// SHA256MBps is sha256 over a buffer on one goroutine, in MB a
	// second: the CPU.
	SHA256MBps float64 `json:"sha256_mb_s"`
	// RoundTrips is one-byte round trips a second between two goroutines
	// over a loopback TCP connection: the system calls and wake-ups every
	// message of the bus costs.
	RoundTrips float64 `json:"loopback_round_trips_s"`
}

// hostProbeFor is how long each half of the probe runs.
const hostProbeFor = time.Second

// probeHost measures the host's speed (HostSpeed), each half for about
// hostProbeFor; nil when the loopback half cannot run.
func probeHost() *HostSpeed {
	h := &HostSpeed{SHA256MBps: sha256Rate(hostProbeFor)}
	rt, err := roundTripRate(hostProbeFor)
	if err != nil {
		return nil
	}
	h.RoundTrips = rt
	return h
}

// sha256Rate is how many MB a second sha256 hashes on one goroutine,
// hashed for about d.
func sha256Rate(d time.Duration) float64 {
	buf := make([]byte, 1<<20)
	for i := range buf {
		buf[i] = byte(i * 7)
	}
	n := 0
	t0 := time.Now()
	for time.Since(t0) < d {
		sum := sha256.Sum256(buf)
		buf[0] = sum[0]
		n++
	}
	return float64(n) * float64(len(buf)) / 1e6 / time.Since(t0).Seconds()
}

// roundTripRate is how many one-byte round trips a second two goroutines
// make over a loopback TCP connection, for about d.
func roundTripRate(d time.Duration) (float64, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	echoed := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			echoed <- err
			return
		}
		defer c.Close()
		_, err = io.Copy(c, c)
		echoed <- err
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		return 0, err
	}
	b := []byte{1}
	n := 0
	t0 := time.Now()
	for time.Since(t0) < d {
		if _, err := c.Write(b); err != nil {
			c.Close()
			return 0, err
		}
		if _, err := io.ReadFull(c, b); err != nil {
			c.Close()
			return 0, err
		}
		n++
	}
	rate := float64(n) / time.Since(t0).Seconds()
	c.Close()
	if err := <-echoed; err != nil {
		return 0, fmt.Errorf("the loopback echo: %w", err)
	}
	return rate, nil
}

// hostLine says the host's speed at a run's start and end for the
// document, or that it was not probed (a run saved before the probe).
func hostLine(h [2]*HostSpeed) string {
	if h[0] == nil || h[1] == nil {
		return "the host's speed was not probed in this run"
	}
	return fmt.Sprintf("the host's speed, probed as the run began and as it ended: sha256 %.0f and %.0f MB/s on one core, %.0f and %.0f loopback TCP round trips a second",
		h[0].SHA256MBps, h[1].SHA256MBps, h[0].RoundTrips, h[1].RoundTrips)
}

// hostVersus compares a run's host speed with a saved run's, as the mean
// of each run's two probes: "" when either was not probed.
func hostVersus(now, saved [2]*HostSpeed) string {
	if now[0] == nil || now[1] == nil || saved[0] == nil || saved[1] == nil {
		return ""
	}
	mean := func(h [2]*HostSpeed, f func(*HostSpeed) float64) float64 { return (f(h[0]) + f(h[1])) / 2 }
	sha := func(h *HostSpeed) float64 { return h.SHA256MBps }
	rt := func(h *HostSpeed) float64 { return h.RoundTrips }
	return fmt.Sprintf("this host against the saved run's: sha256 ×%.2f, loopback round trips ×%.2f (below 1: slower; figures of the two runs compare only as far as these do)",
		mean(now, sha)/mean(saved, sha), mean(now, rt)/mean(saved, rt))
}
