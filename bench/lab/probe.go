package lab

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"sync"
	"time"

	"github.com/dnsstandby/dnsstandby/internal/nstest"
)

const (
	// ProbeDefaultEvery is how often the glibc probe starts a lookup
	// (issue 4: every 200 ms).
	ProbeDefaultEvery = 200 * time.Millisecond
	// probeMaxInFlight caps the lookups running at once. A lookup that
	// gets no answer takes glibc's timeout times its attempts, 10 s with
	// the defaults (timeout:5 attempts:2), so at one start per 200 ms about
	// 50 run at once in an outage; starts beyond the cap are skipped and
	// counted, not queued.
	probeMaxInFlight = 64
	// probeTimeout kills a lookup that has run this long and counts it as
	// failed: longer than glibc's own worst case for one nameserver with
	// the default options, so only a stuck lookup reaches it.
	probeTimeout = 30 * time.Second
)

// ProbeRecord is one `getent ahosts` run.
type ProbeRecord struct {
	Start    time.Duration // since ProbeResult.Start
	Duration time.Duration // until it exited (or was killed)
	OK       bool          // exit status 0: the name resolved
	Finished bool          // false if it was still running when the probe ended (ctx ended): neither ok nor failed
}

// ProbeResult is what a glibc probe recorded.
type ProbeResult struct {
	Start   time.Time // origin of every record's Start
	FQDN    string
	Every   time.Duration
	Records []ProbeRecord // in start order
	Skipped int           // starts skipped because probeMaxInFlight lookups were running
}

// Counts counts the finished lookups that succeeded and that failed.
func (r ProbeResult) Counts() (ok, fail int) {
	for _, p := range r.Records {
		switch {
		case !p.Finished:
		case p.OK:
			ok++
		default:
			fail++
		}
	}
	return ok, fail
}

// GlibcProbe is a running glibc probe: what an application in the pod sees.
type GlibcProbe struct {
	ns    *nstest.Namespace // always non-nil
	fqdn  string
	every time.Duration
	start time.Time
	ctx   context.Context // good until the probe ends; kills running lookups when it ends

	stopCh   chan struct{} // closed by Stop
	loopDone chan struct{}
	wg       sync.WaitGroup // lookups running
	sem      chan struct{}  // one token per running lookup
	stopOnce sync.Once
	result   ProbeResult

	mu      sync.Mutex // guards following
	records []ProbeRecord
	skipped int
}

// StartGlibcProbe starts `getent ahosts FQDN` in ns every `every`
// (ProbeDefaultEvery if 0), each run in its own goroutine, at most
// probeMaxInFlight at once. getent runs through `ip netns exec`, so glibc
// reads /etc/netns/NS/resolv.conf (nstest's SetResolvConf). fqdn gets a
// trailing dot if it has none, so no search list applies.
func StartGlibcProbe(ctx context.Context, ns *nstest.Namespace, fqdn string, every time.Duration) (*GlibcProbe, error) {
	if ns == nil {
		return nil, errors.New("glibc probe: no namespace")
	}
	if fqdn == "" {
		return nil, errors.New("glibc probe: no name")
	}
	if !strings.HasSuffix(fqdn, ".") {
		fqdn += "."
	}
	if every == 0 {
		every = ProbeDefaultEvery
	}
	if every < 0 {
		return nil, fmt.Errorf("glibc probe: interval %v", every)
	}
	if _, err := exec.LookPath("getent"); err != nil {
		return nil, fmt.Errorf("glibc probe: %w (install libc-bin)", err)
	}
	p := &GlibcProbe{
		ns:       ns,
		fqdn:     fqdn,
		every:    every,
		ctx:      ctx,
		stopCh:   make(chan struct{}),
		loopDone: make(chan struct{}),
		sem:      make(chan struct{}, probeMaxInFlight),
	}
	p.start = time.Now()
	go p.loop()
	return p, nil
}

// Start is the origin of every record's Start.
func (p *GlibcProbe) Start() time.Time { return p.start }

func (p *GlibcProbe) loop() {
	defer close(p.loopDone)
	tick := time.NewTicker(p.every)
	defer tick.Stop()
	for {
		p.launch()
		select {
		case <-tick.C:
		case <-p.stopCh:
			return
		case <-p.ctx.Done():
			return
		}
	}
}

// launch starts one lookup, or counts a skip if too many are running.
func (p *GlibcProbe) launch() {
	select {
	case p.sem <- struct{}{}:
	default:
		p.mu.Lock()
		p.skipped++
		p.mu.Unlock()
		return
	}
	p.mu.Lock()
	i := len(p.records)
	began := time.Since(p.start)
	p.records = append(p.records, ProbeRecord{Start: began})
	p.mu.Unlock()
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		defer func() { <-p.sem }()
		ctx, cancel := context.WithTimeout(p.ctx, probeTimeout)
		defer cancel()
		err := p.ns.Command(ctx, "getent", "ahosts", p.fqdn).Run()
		took := time.Since(p.start) - began
		// Killed because the caller's context ended: no verdict.
		finished := p.ctx.Err() == nil
		p.mu.Lock()
		p.records[i] = ProbeRecord{Start: began, Duration: took, OK: err == nil, Finished: finished}
		p.mu.Unlock()
	}()
}

// Stop starts no more lookups, waits for those running (each ends within
// glibc's own timeouts, 10 s at worst with the default options, or is
// killed at probeTimeout; cancel the context to end them at once, then they
// count as unfinished), and returns what was recorded. Safe to call more
// than once.
func (p *GlibcProbe) Stop() ProbeResult {
	p.stopOnce.Do(func() {
		close(p.stopCh)
		<-p.loopDone
		p.wg.Wait()
		p.mu.Lock()
		defer p.mu.Unlock()
		p.result = ProbeResult{
			Start:   p.start,
			FQDN:    p.fqdn,
			Every:   p.every,
			Records: append([]ProbeRecord(nil), p.records...),
			Skipped: p.skipped,
		}
	})
	return p.result
}
