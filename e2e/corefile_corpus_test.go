package e2e

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dnsstandby/dnsstandby/corefile"
	"github.com/dnsstandby/dnsstandby/daemon"
	"github.com/dnsstandby/dnsstandby/internal/nstest"
)

// load is dnsstandby's verdict on a Corefile, as the daemon decides it
// (daemon.Resolver: read and checked as CoreDNS reads it, then the
// configuration it gives valid): nil means it would apply it.
// TestCorefileCorpus holds it against CoreDNS's.
var load = func(p string) error {
	src, err := corefile.Read(p)
	if err != nil {
		return err
	}
	cfg, err := daemon.DefaultLayer(corpusListen)(src)
	if err == nil {
		err = cfg.Validate()
	}
	return err
}

// corpusListen are LocalDNS's listeners, which dnsstandby serves.
var corpusListen = []netip.AddrPort{netip.MustParseAddrPort("169.254.10.10:53"), netip.MustParseAddrPort("169.254.10.11:53")}

const (
	// corpusAnswerTimeout bounds how long a CoreDNS may take to answer
	// before it counts as refusing the Corefile. It starts in about 100 ms
	// here; a loaded machine gets ample margin, and only a Corefile CoreDNS
	// starts on yet never answers waits this long.
	corpusAnswerTimeout = 5 * time.Second
	// corpusProbeEvery is how often the probe is sent again while CoreDNS
	// starts: a probe sent before its listener exists is lost.
	corpusProbeEvery = 10 * time.Millisecond
	// corpusLinger is how long CoreDNS is watched after it started on a
	// Corefile marked Linger: the loop plugin ends it within milliseconds
	// of start-up, after it answered.
	corpusLinger = 3 * time.Second
	// corpusDumpEnv names a file to write every mutation's verdicts to, as
	// JSON lines (what the work list for the loader is written from).
	corpusDumpEnv = "DNSSTANDBY_CORPUS_DUMP"
	// coreDNSBanner is what CoreDNS prints once every server has started
	// and every plugin's start-up has run (coremain prints it after
	// caddy.Start returns).
	coreDNSBanner = "CoreDNS-"
)

// coreDNSVerdict is what CoreDNS made of a Corefile.
type coreDNSVerdict struct {
	Accepted bool   `json:"coredns_accepted"`
	Late     bool   `json:"coredns_exited_after_start,omitempty"` // started and answered, then exited (counts as refused)
	Reason   string `json:"coredns_error,omitempty"`              // the last line CoreDNS printed before it exited, or why it counts as refused
	Output   string `json:"coredns_output"`                       // for the dump
}

// corpusResult is one mutation with both verdicts.
type corpusResult struct {
	mutation
	coreDNSVerdict
	Standby string `json:"dnsstandby_error,omitempty"` // load's error; "" when dnsstandby accepts
	// TestErr is why the test could not get a verdict (writing the file,
	// starting CoreDNS, entering the namespace): a failure of the test,
	// never counted as a refusal.
	TestErr string `json:"test_error,omitempty"`
}

// TestCorefileCorpus holds dnsstandby's Corefile loader to CoreDNS 1.13.1
// (LocalDNS) on several hundred mutations of the AgentBaker renderings in
// corefile/testdata (see corpus_gen_test.go): no Corefile that CoreDNS
// refuses may be accepted by dnsstandby, for LocalDNS crash-loops on it
// while dnsstandby would apply it. Corefiles CoreDNS accepts and dnsstandby
// refuses are listed, with dnsstandby's reason, but are no failure.
//
// CoreDNS accepts a Corefile when it starts and a DNS message sent to one
// of its listeners is answered; it refuses it when it exits (its last line
// is the reason) or answers nothing within corpusAnswerTimeout. Each
// CoreDNS runs in a namespace of its own, a few at a time (ready's 8181 and
// prometheus's 9253 would collide in one), with LocalDNS's addresses on a
// bridge named localdns, and dnsstandby's loader runs inside the same
// namespace, so that `bind localdns` means the same to both.
func TestCorefileCorpus(t *testing.T) {
	nstest.RequireRoot(t)
	bin := nstest.CoreDNSBinary(t)

	paths, err := filepath.Glob("../corefile/testdata/*.corefile")
	must(t, err)
	muts, err := buildCorpus(paths)
	must(t, err)
	perCat := map[string]int{}
	for _, m := range muts {
		perCat[m.Category]++
	}
	if len(muts) < 300 {
		t.Fatalf("corpus has %d mutations, want at least 300", len(muts))
	}
	for _, c := range corpusCategories {
		if perCat[c] == 0 {
			t.Fatalf("corpus has no mutation of category %s", c)
		}
	}
	t.Logf("corpus: %d mutations of %d renderings", len(muts), len(paths))

	// Two workers a core: CoreDNS's start is CPU-bound, and while one
	// waits for its listeners the other starts.
	workers := make([]*corpusWorker, min(2*runtime.GOMAXPROCS(0), 8))
	for i := range workers {
		workers[i] = newCorpusWorker(t, i, bin)
	}
	results := make([]corpusResult, len(muts))
	next := make(chan int)
	var wg sync.WaitGroup
	for _, w := range workers {
		wg.Go(func() {
			for j := range next {
				results[j] = w.run(muts[j])
			}
		})
	}
	start := time.Now()
	for j := range muts {
		next <- j
	}
	close(next)
	wg.Wait()
	t.Logf("ran %d CoreDNS in %v with %d workers", len(muts), time.Since(start).Round(time.Millisecond), len(workers))

	type tally struct{ total, accepted, refused, agree, refusedOnly, acceptedOnly int }
	tallies := map[string]*tally{}
	all := &tally{}
	for _, c := range corpusCategories {
		tallies[c] = &tally{}
	}
	for _, r := range results {
		if r.TestErr != "" {
			t.Errorf("no verdict for %s: %s", r.label(), r.TestErr)
			continue
		}
		for _, n := range []*tally{tallies[r.Category], all} {
			n.total++
			switch {
			case r.Accepted:
				n.accepted++
			default:
				n.refused++
			}
			switch {
			case r.Accepted == (r.Standby == ""):
				n.agree++
			case r.Accepted:
				n.acceptedOnly++
			default:
				n.refusedOnly++
			}
		}
		switch {
		case !r.Accepted && r.Standby == "":
			t.Errorf("CoreDNS refuses, dnsstandby accepts: %s\n  CoreDNS: %s\n%s", r.label(), r.Reason, indent(r.Diff))
		case r.Accepted && r.Standby != "":
			t.Logf("CoreDNS accepts, dnsstandby refuses: %s\n  dnsstandby: %s\n%s", r.label(), r.Standby, indent(r.Diff))
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%-20s %6s %9s %8s %6s %11s %11s\n", "category", "total", "accepted", "refused", "agree", "refused-ok", "accepted-no")
	row := func(name string, n *tally) {
		fmt.Fprintf(&b, "%-20s %6d %9d %8d %6d %11d %11d\n", name, n.total, n.accepted, n.refused, n.agree, n.refusedOnly, n.acceptedOnly)
	}
	for _, c := range corpusCategories {
		row(c, tallies[c])
	}
	row("all", all)
	t.Logf("verdicts: accepted and refused by CoreDNS 1.13.1; agree: dnsstandby's loader the same; "+
		"refused-ok: CoreDNS refuses, dnsstandby accepts (failures); accepted-no: CoreDNS accepts, dnsstandby refuses\n%s", b.String())

	if p := os.Getenv(corpusDumpEnv); p != "" {
		must(t, dumpCorpus(p, results))
		t.Logf("verdicts written to %s", p)
	}
}

func indent(s string) string {
	return "    " + strings.ReplaceAll(s, "\n", "\n    ")
}

func dumpCorpus(path string, results []corpusResult) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	enc := json.NewEncoder(f)
	for _, r := range results {
		if err := enc.Encode(r); err != nil {
			f.Close()
			return err
		}
	}
	return f.Close()
}

// corpusWorker runs one CoreDNS at a time in a namespace of its own.
type corpusWorker struct {
	ns      *nstest.Namespace
	bin     string
	dir     string         // holds the Corefile under test
	conn    net.PacketConn // opened in ns: sends the probes, reads their answers
	replies chan uint16    // IDs of the answers conn reads
	id      uint16         // the current probe's ID
}

func newCorpusWorker(t *testing.T, i int, bin string) *corpusWorker {
	t.Helper()
	w := &corpusWorker{
		ns:      nstest.New(t, fmt.Sprintf("corpus%d", i)),
		bin:     bin,
		dir:     t.TempDir(),
		replies: make(chan uint16, 64),
		id:      uint16(i) << 12,
	}
	must(t, w.ns.AddLink("localdns", "", listenerAddrs()...))
	// Every forward target is routed onto the bridge, where it has no
	// neighbour: queries CoreDNS forwards stay unanswered inside the
	// namespace. Without a route, each send fails at once and forward
	// retries in a busy loop for 5 s, which would eat the CPU the other
	// workers need.
	must(t, w.ns.AddRoute(nstest.Route{Dst: "0.0.0.0/0", Dev: "localdns"}))
	must(t, w.ns.Do(func() (err error) {
		w.conn, err = net.ListenPacket("udp", ":0")
		return err
	}))
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 512)
		for {
			n, _, err := w.conn.ReadFrom(buf)
			if err != nil {
				return // closed by the cleanup below
			}
			if n >= 12 && buf[2]&0x80 != 0 { // a response
				select {
				case w.replies <- uint16(buf[0])<<8 | uint16(buf[1]):
				default: // the worker is not waiting; stale
				}
			}
		}
	}()
	t.Cleanup(func() {
		w.conn.Close()
		<-done
	})
	return w
}

// listenerAddrs are LocalDNS's listener addresses, which the renderings bind.
func listenerAddrs() []string {
	var out []string
	for _, a := range corpusListen {
		out = append(out, a.Addr().String()+"/32")
	}
	return out
}

// run gives CoreDNS and then dnsstandby's loader mutation m.
func (w *corpusWorker) run(m mutation) corpusResult {
	res := corpusResult{mutation: m}
	path := filepath.Join(w.dir, "Corefile")
	if err := os.WriteFile(path, []byte(m.Text), 0o644); err != nil {
		res.TestErr = err.Error()
		return res
	}
	var err error
	res.coreDNSVerdict, err = w.coreDNS(path, m.Linger)
	if err != nil {
		res.TestErr = err.Error()
		return res
	}
	if derr := w.ns.Do(func() error { err = load(path); return nil }); derr != nil {
		res.TestErr = "run the loader: " + derr.Error()
		return res
	}
	if err != nil {
		res.Standby = strings.ReplaceAll(err.Error(), w.dir+"/", "")
		if res.Standby == "" {
			res.Standby = fmt.Sprintf("%T with an empty message", err)
		}
	}
	return res
}

// listenerLine is how CoreDNS lists a server it started: "ZONE:PORT" (every
// address) or "ZONE:PORT on ADDR", with a transport prefix if not DNS.
var listenerLine = regexp.MustCompile(`(?m)^(\S*?):(\d+)(?: on (\S+))?$`)

// coreDNS starts CoreDNS on the Corefile at path, and returns once it has
// answered a probe, has exited, or corpusAnswerTimeout has passed; for a
// Corefile marked linger, it then watches CoreDNS for corpusLinger more.
// Its error means CoreDNS could not be run at all: no verdict.
func (w *corpusWorker) coreDNS(path string, linger bool) (coreDNSVerdict, error) {
	p, err := w.ns.StartIn(w.dir, w.bin, "-conf", path)
	if err != nil {
		return coreDNSVerdict{}, err
	}
	defer p.Stop()

	// The probe is a query with no question: the DNS server under every
	// listener answers it (FORMERR) before any plugin sees it, so it shows
	// a listener is serving whatever its blocks do with real queries —
	// their forward targets never answer here.
	w.id++
	probe := make([]byte, 12)
	probe[0], probe[1] = byte(w.id>>8), byte(w.id)
drain: // answers to an earlier CoreDNS's probes
	for {
		select {
		case <-w.replies:
		default:
			break drain
		}
	}
	answered := false
	timeout := time.NewTimer(corpusAnswerTimeout)
	defer timeout.Stop()
	tick := time.NewTicker(corpusProbeEvery)
	defer tick.Stop()
	for {
		out := p.Output()
		if answered && strings.Contains(out, coreDNSBanner) {
			if !linger {
				return coreDNSVerdict{Accepted: true, Output: out}, nil
			}
			select {
			case <-p.Done():
				out := p.Output()
				return coreDNSVerdict{Late: true, Reason: w.lastLine(out, p.Err()), Output: out}, nil
			case <-time.After(corpusLinger):
				return coreDNSVerdict{Accepted: true, Output: p.Output()}, nil
			}
		}
		if !answered {
			for _, a := range probeTargets(out) {
				w.conn.WriteTo(probe, net.UDPAddrFromAddrPort(a))
			}
		}
		select {
		case <-p.Done():
			out := p.Output()
			return coreDNSVerdict{Reason: w.lastLine(out, p.Err()), Output: out}, nil
		case id := <-w.replies:
			answered = answered || id == w.id
		case <-timeout.C:
			if strings.Contains(out, coreDNSBanner) {
				return coreDNSVerdict{Reason: fmt.Sprintf("started, but no listener answered within %v", corpusAnswerTimeout), Output: out}, nil
			}
			return coreDNSVerdict{Reason: fmt.Sprintf("neither answered nor exited within %v", corpusAnswerTimeout), Output: out}, nil
		case <-tick.C:
		}
	}
}

// probeTargets are LocalDNS's listeners and whatever else CoreDNS says it
// listens on (127.0.0.1 standing for every address).
func probeTargets(out string) []netip.AddrPort {
	targets := slices.Clone(corpusListen)
	for _, m := range listenerLine.FindAllStringSubmatch(out, -1) {
		if strings.Contains(m[1], "://") && !strings.HasPrefix(m[1], "dns://") {
			continue
		}
		addr := "127.0.0.1"
		if m[3] != "" {
			addr = m[3]
		}
		a, err := netip.ParseAddrPort(net.JoinHostPort(addr, m[2]))
		if err != nil || slices.Contains(targets, a) {
			continue
		}
		targets = append(targets, a)
	}
	return targets
}

// lastLine is the reason CoreDNS gave for exiting: the last line of its
// output that is not start-up chatter, with the worker's directory taken
// out of paths.
func (w *corpusWorker) lastLine(out string, exit error) string {
	lines := strings.Split(strings.TrimSpace(out), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		l := strings.TrimSpace(lines[i])
		if l == "" || strings.HasPrefix(l, "maxprocs:") || strings.HasPrefix(l, "[WARNING]") || strings.HasPrefix(l, "[INFO]") {
			continue
		}
		return strings.ReplaceAll(l, w.dir+"/", "")
	}
	var ee interface{ ExitCode() int }
	if errors.As(exit, &ee) {
		return fmt.Sprintf("exited (status %d) saying nothing", ee.ExitCode())
	}
	return fmt.Sprintf("exited: %v", exit)
}
