package nstest_test

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/dnsstandby/dnsstandby/internal/nstest"
	"github.com/dnsstandby/dnsstandby/internal/testkit"
)

const (
	clusterIP = "10.0.0.10" // kube-dns's ClusterIP on an AKS cluster
	nodeIP    = "10.224.0.4"
	dnsAddr   = clusterIP + ":53"
	timeout   = 2 * time.Second
)

// lab is the topology of TestKubeDNS: a node namespace reaching a kube-dns
// namespace over a veth, as a node reaches kube-dns's ClusterIP.
type lab struct {
	kubedns, node *nstest.Namespace
	coredns       *nstest.CoreDNS
	zones         *nstest.Zones
	links         []string // every link name the lab made
}

func newLab(t *testing.T) *lab {
	t.Helper()
	l := &lab{
		kubedns: nstest.New(t, "kubedns"),
		node:    nstest.New(t, "node"),
		zones:   nstest.KubeDNSZones(nstest.ZoneOptions{Services: 30, Namespaces: []string{"default", "kube-system", "team-a"}}),
		links:   []string{"kubedns", "nodeip", "to-kubedns", "to-node"},
	}
	must(t, l.kubedns.AddLink("kubedns", "", clusterIP+"/32"))
	must(t, l.node.AddLink("nodeip", "", nodeIP+"/32"))
	must(t, nstest.AddVeth(
		nstest.End{NS: l.node, Name: "to-kubedns", Addrs: []string{"10.200.0.1/30"}},
		nstest.End{NS: l.kubedns, Name: "to-node", Addrs: []string{"10.200.0.2/30"}},
	))
	must(t, l.node.AddRoute(nstest.Route{Dst: clusterIP + "/32", Via: "10.200.0.2"}))
	must(t, l.kubedns.AddRoute(nstest.Route{Dst: "10.224.0.0/16", Via: "10.200.0.1"}))
	l.coredns = nstest.StartCoreDNS(t, l.kubedns, nstest.CoreDNSConfig{
		Corefile: l.zones.Corefile(clusterIP),
		Files:    l.zones.Files,
		Probe:    dnsAddr,
	})
	return l
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestKubeDNS builds the lab, queries CoreDNS from the node namespace with a
// Go client and with dig, then checks that cleanup left nothing behind.
func TestKubeDNS(t *testing.T) {
	nstest.RequireRoot(t)
	nstest.CoreDNSBinary(t)

	var (
		names  []string
		links  []string
		inodes []uint64
		pid    int
	)
	t.Run("lab", func(t *testing.T) {
		l := newLab(t)
		names = []string{l.kubedns.Name(), l.node.Name()}
		links = l.links
		inodes = []uint64{nsInode(t, l.kubedns), nsInode(t, l.node)}
		pid = l.coredns.Pid()

		listed := nstest.Run(t, l.node, "ip", "netns", "list")
		for _, n := range names {
			if !strings.Contains(listed, n) {
				t.Errorf("ip netns list does not show %s:\n%s", n, listed)
			}
		}
		t.Run("go-client", func(t *testing.T) { testGoClient(t, l) })
		t.Run("socket-in-namespace", func(t *testing.T) { testSocketInNamespace(t, l) })
		t.Run("truncation", func(t *testing.T) { testTruncation(t, l) })
		t.Run("dig", func(t *testing.T) { testDig(t, l) })
		t.Run("resolv.conf", func(t *testing.T) { testResolvConf(t, l) })
		t.Run("freeze", func(t *testing.T) { testFreeze(t, l) })
	})
	if t.Failed() {
		return
	}
	checkGone(t, names, links, inodes, pid)
}

// testFreeze: once Freeze returns, every thread of CoreDNS is stopped and
// a query goes unanswered; after SIGCONT CoreDNS answers again.
func testFreeze(t *testing.T, l *lab) {
	q := l.zones.Cases[0].Question()
	must(t, l.coredns.Freeze())
	frozen := true
	defer func() {
		if frozen {
			l.coredns.Signal(syscall.SIGCONT)
		}
	}()
	if r, err := l.node.Exchange("udp", "", dnsAddr, q, 300*time.Millisecond); err == nil {
		t.Errorf("frozen CoreDNS answered: %v", r)
	}
	must(t, l.coredns.Signal(syscall.SIGCONT))
	frozen = false
	if _, err := l.node.Exchange("udp", "", dnsAddr, q, timeout); err != nil {
		t.Errorf("after SIGCONT: %v", err)
	}
}

// testGoClient asks every case over UDP from the node's address, so both
// routes (there and back) are used.
func testGoClient(t *testing.T, l *lab) {
	for _, c := range l.zones.Cases {
		r, err := l.node.Exchange("udp", nodeIP+":0", dnsAddr, c.Question(), timeout)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Check(r); err != nil {
			t.Errorf("%v (%s)", err, c.Why)
		}
	}
}

// testSocketInNamespace opens a socket inside Do and uses it after Do
// returned, from this goroutine: the socket stays in the namespace.
func testSocketInNamespace(t *testing.T, l *lab) {
	var conn net.Conn
	var ifaces []string
	err := l.node.Do(func() error {
		list, err := net.Interfaces()
		if err != nil {
			return err
		}
		for _, i := range list {
			ifaces = append(ifaces, i.Name)
		}
		conn, err = net.Dial("udp", dnsAddr)
		return err
	})
	must(t, err)
	defer conn.Close()
	slices.Sort(ifaces)
	if want := []string{"lo", "nodeip", "to-kubedns"}; !slices.Equal(ifaces, want) {
		t.Errorf("interfaces seen inside Do: %v, want %v", ifaces, want)
	}
	if local := conn.LocalAddr().(*net.UDPAddr).IP.String(); local != "10.200.0.1" {
		t.Errorf("socket bound to %s, want the node's veth address 10.200.0.1", local)
	}
	c := l.zones.Cases[0]
	r, _, err := (&dns.Client{Timeout: timeout}).ExchangeWithConn(c.Question(), &dns.Conn{Conn: conn})
	must(t, err)
	if err := c.Check(r); err != nil {
		t.Error(err)
	}
}

// testTruncation asks for the large answer over UDP without EDNS (it comes
// truncated) and over TCP (it comes whole).
func testTruncation(t *testing.T, l *lab) {
	c, ok := l.zones.Case(nstest.LargeName, dns.TypeA)
	if !ok || !c.Large || len(c.Answer) != nstest.LargeCount {
		t.Fatalf("zones have no large case with %d records: %+v", nstest.LargeCount, c)
	}
	q := new(dns.Msg)
	q.SetQuestion(c.Name, c.Type)
	r, err := l.node.Exchange("udp", "", dnsAddr, q, timeout)
	must(t, err)
	if !r.Truncated {
		t.Errorf("plain UDP reply for %s not truncated (%d answers)", c, len(r.Answer))
	}
	r, err = l.node.Exchange("tcp", nodeIP+":0", dnsAddr, q, timeout)
	must(t, err)
	if err := c.Check(r); err != nil {
		t.Errorf("over TCP: %v", err)
	}
}

// testDig asks every case but most of the services with dig, through `ip
// netns exec`.
func testDig(t *testing.T, l *lab) {
	for i, c := range l.zones.Cases {
		service := strings.HasPrefix(c.Name, "svc-") || strings.HasPrefix(c.Name, "_http.")
		if service && i >= 4 {
			continue
		}
		rcode, answer := nstest.Dig(t, l.node, "@"+clusterIP, "-b", nodeIP, c.Name, dns.TypeToString[c.Type])
		if err := c.CheckRRs(rcode, answer); err != nil {
			t.Errorf("dig: %v (%s)", err, c.Why)
		}
	}
}

// testResolvConf resolves a short service name the way a pod's glibc does,
// through the namespace's /etc/netns resolv.conf and its search path.
func testResolvConf(t *testing.T, l *lab) {
	must(t, l.node.SetResolvConf("nameserver "+clusterIP+"\n"+
		"search default.svc.cluster.local svc.cluster.local cluster.local\noptions ndots:5 timeout:1 attempts:1\n"))
	var svc nstest.Service
	for _, s := range l.zones.Services {
		if s.Namespace == "default" {
			svc = s
		}
	}
	out := nstest.Run(t, l.node, "getent", "ahostsv4", svc.Name)
	if !strings.HasPrefix(out, svc.IP.String()+" ") {
		t.Errorf("getent ahostsv4 %s = %q, want %s", svc.Name, out, svc.IP)
	}
	out = nstest.Run(t, l.node, "getent", "ahostsv4", "kubernetes.default")
	if !strings.HasPrefix(out, "10.0.0.1 ") {
		t.Errorf("getent ahostsv4 kubernetes.default = %q, want 10.0.0.1", out)
	}
	if _, err := os.Stat(filepath.Join("/etc/netns", l.node.Name(), "resolv.conf")); err != nil {
		t.Error(err)
	}
}

// nsInode identifies a namespace for checkGone without holding it open.
func nsInode(t *testing.T, ns *nstest.Namespace) uint64 {
	t.Helper()
	var st syscall.Stat_t
	must(t, syscall.Stat(ns.Path(), &st))
	return st.Ino
}

// checkGone fails unless every namespace, link, file and process a lab
// made is gone: not listed, not mounted, and not held by any process (the
// kernel then frees each namespace and the links in it).
func checkGone(t *testing.T, names, links []string, inodes []uint64, pid int) {
	t.Helper()
	out, err := hostRun("ip", "netns", "list")
	must(t, err)
	for _, n := range names {
		if strings.Contains(out, n) {
			t.Errorf("namespace %s still listed:\n%s", n, out)
		}
		for _, p := range []string{filepath.Join("/run/netns", n), filepath.Join("/etc/netns", n)} {
			if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("%s still there (%v)", p, err)
			}
		}
	}
	out, err = hostRun("ip", "-o", "link", "show")
	must(t, err)
	for _, line := range strings.Split(out, "\n") {
		fields := strings.Fields(line)
		if len(fields) < 2 {
			continue
		}
		name, _, _ := strings.Cut(strings.TrimSuffix(fields[1], ":"), "@")
		if slices.Contains(links, name) {
			t.Errorf("link %s in the test's own namespace: %s", name, line)
		}
	}
	if pid > 0 && alive(pid) {
		t.Errorf("coredns pid %d is still alive", pid)
	}
	for _, holder := range nsHolders(inodes) {
		t.Errorf("namespace still held: %s", holder)
	}
	if mounts, err := os.ReadFile("/proc/self/mountinfo"); err == nil {
		for _, n := range names {
			if strings.Contains(string(mounts), n) {
				t.Errorf("namespace %s still mounted", n)
			}
		}
	}
}

// alive reports whether pid is a process that has not exited (a zombie
// waiting for its parent to reap it has).
func alive(pid int) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// The state follows the command name, which is in parentheses.
	i := strings.LastIndexByte(string(stat), ')')
	if i < 0 || i+2 >= len(stat) {
		return true
	}
	state := stat[i+2]
	return state != 'Z' && state != 'X'
}

// nsHolders lists the threads and file descriptors in the system that refer
// to one of the namespaces by inode.
func nsHolders(inodes []uint64) []string {
	want := map[string]bool{}
	for _, ino := range inodes {
		want[fmt.Sprintf("net:[%d]", ino)] = true
	}
	var held []string
	check := func(path string) {
		if target, err := os.Readlink(path); err == nil && want[target] {
			held = append(held, path+" -> "+target)
		}
	}
	procs, _ := filepath.Glob("/proc/[0-9]*")
	for _, p := range procs {
		tasks, _ := filepath.Glob(p + "/task/*/ns/net")
		for _, task := range tasks {
			check(task)
		}
		fds, _ := filepath.Glob(p + "/fd/*")
		for _, fd := range fds {
			check(fd)
		}
	}
	return held
}

// TestCleanupAfterFailure fails a test half-way (a CoreDNS whose Corefile
// does not parse) and checks that its cleanups remove everything.
func TestCleanupAfterFailure(t *testing.T) {
	nstest.RequireRoot(t)
	nstest.CoreDNSBinary(t)
	ft := &fakeTB{TB: t}
	var name string
	var inode uint64
	var coredns *nstest.CoreDNS
	ft.run(func() {
		ns := nstest.New(ft, "failing")
		name = ns.Name()
		var st syscall.Stat_t
		must(ft, syscall.Stat(ns.Path(), &st))
		inode = st.Ino
		must(ft, ns.AddLink("anchor", "", "169.254.10.11/32"))
		must(ft, ns.SetResolvConf("nameserver 169.254.10.11\n"))
		coredns = nstest.StartCoreDNS(ft, ns, nstest.CoreDNSConfig{
			Corefile: ".:53 {\n    bind 169.254.10.11\n    no-such-plugin\n}\n",
			Probe:    "169.254.10.11:53",
		})
	})
	if !ft.failed {
		t.Fatal("the failing test did not fail")
	}
	if !strings.Contains(ft.log.String(), "no-such-plugin") {
		t.Errorf("CoreDNS's complaint not in the test log:\n%s", ft.log.String())
	}
	if coredns != nil {
		t.Fatal("StartCoreDNS returned")
	}
	ft.cleanup()
	checkGone(t, []string{name}, []string{"anchor"}, []uint64{inode}, 0)
}

// fakeTB is a test that can fail without failing the real one.
type fakeTB struct {
	testing.TB // the real test, for TempDir, Context, Helper

	mu       sync.Mutex
	failed   bool
	log      strings.Builder
	cleanups []func()
}

// run runs body as a test body: on a goroutine of its own, so that FailNow
// can end it.
func (f *fakeTB) run(body func()) {
	done := make(chan struct{})
	go func() { defer close(done); body() }()
	<-done
}

func (f *fakeTB) cleanup() {
	for i := len(f.cleanups) - 1; i >= 0; i-- {
		f.cleanups[i]()
	}
}

func (f *fakeTB) Cleanup(fn func()) { f.cleanups = append(f.cleanups, fn) }
func (f *fakeTB) Failed() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.failed
}
func (f *fakeTB) Log(args ...any) { f.Logf("%s", fmt.Sprintln(args...)) }
func (f *fakeTB) Logf(format string, args ...any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fmt.Fprintf(&f.log, format+"\n", args...)
}
func (f *fakeTB) Error(args ...any) { f.Errorf("%s", fmt.Sprintln(args...)) }
func (f *fakeTB) Errorf(format string, args ...any) {
	f.Logf(format, args...)
	f.mu.Lock()
	f.failed = true
	f.mu.Unlock()
}
func (f *fakeTB) Fatal(args ...any)                 { f.Error(args...); runtime.Goexit() }
func (f *fakeTB) Fatalf(format string, args ...any) { f.Errorf(format, args...); runtime.Goexit() }
func (f *fakeTB) FailNow()                          { f.Fatal("FailNow") }
func (f *fakeTB) Skip(args ...any) {
	f.TB.Error("unexpected skip: ", fmt.Sprint(args...))
	runtime.Goexit()
}
func (f *fakeTB) Skipf(format string, args ...any) { f.Skip(fmt.Sprintf(format, args...)) }

// TestDoRestoresThreads runs many Do calls at once and checks that every
// thread of the process is back in the test's own namespace afterwards,
// that a panic in fn comes back to the caller, and that Do after Close
// fails.
func TestDoRestoresThreads(t *testing.T) {
	nstest.RequireRoot(t)
	ns := nstest.New(t, "threads")
	own, err := os.Readlink("/proc/self/ns/net")
	must(t, err)
	const calls = 64
	var wg, inside sync.WaitGroup
	inside.Add(calls)
	all := make(chan struct{}) // closed once every call is inside at once
	go func() { inside.Wait(); close(all) }()
	errs := make(chan error, calls)
	for range calls {
		wg.Go(func() {
			ran := false
			err := ns.Do(func() error {
				ran = true
				defer func() { <-all }() // hold the thread until every call holds one
				inside.Done()
				link, err := os.Readlink(fmt.Sprintf("/proc/self/task/%d/ns/net", syscall.Gettid()))
				if err != nil {
					return err
				}
				if link == own {
					return errors.New("Do's thread is still in the test's namespace")
				}
				return nil
			})
			if !ran { // Do failed before fn: do not hold the others forever
				inside.Done()
			}
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	tasks, err := filepath.Glob("/proc/self/task/*/ns/net")
	must(t, err)
	for _, task := range tasks {
		if link, err := os.Readlink(task); err == nil && link != own {
			t.Errorf("thread %s is in %s, not the test's %s", task, link, own)
		}
	}

	func() {
		defer func() {
			if r := recover(); r != "boom" {
				t.Errorf("recovered %v, want the panic from fn", r)
			}
		}()
		ns.Do(func() error { panic("boom") })
	}()
	if err := ns.Do(func() error { runtime.Goexit(); return nil }); err == nil {
		t.Error("Do with an fn that called Goexit returned no error")
	}

	must(t, ns.Close())
	if err := ns.Do(func() error { return nil }); err == nil {
		t.Error("Do after Close succeeded")
	}
}

// TestProcess runs a command to completion and one in the background, and
// checks that Stop kills the whole process group.
func TestProcess(t *testing.T) {
	nstest.RequireRoot(t)
	ns := nstest.New(t, "proc")
	if out := nstest.Run(t, ns, "ip", "-o", "link", "show", "lo"); !strings.Contains(out, "UP") {
		t.Errorf("loopback not up: %s", out)
	}
	if _, err := ns.Run(t.Context(), "sh", "-c", "echo to-stderr >&2; exit 3"); err == nil || !strings.Contains(err.Error(), "to-stderr") {
		t.Errorf("failing command: error %v, want one with its stderr", err)
	}
	p := nstest.Start(t, ns, "sh", "-c", "sleep 60 & echo child $!; wait")
	var child int
	testkit.Eventually(t, 5*time.Second, "the child's pid in the output", func() bool {
		if _, rest, ok := strings.Cut(p.Output(), "child "); ok && strings.HasSuffix(rest, "\n") {
			child, _ = strconv.Atoi(strings.TrimSpace(rest))
		}
		return child != 0
	})
	must(t, p.Stop())
	if p.Err() == nil {
		t.Error("stopped process reports a clean exit")
	}
	// The group's SIGKILL reaches the child asynchronously, and the orphan
	// is reaped by init in its own time: dead within a moment is enough.
	testkit.Eventually(t, 2*time.Second, fmt.Sprintf("child %d of the stopped process to die", child), func() bool { return !alive(child) })
}

// TestKubeDNSZones checks the generated zones without a kernel: every file
// parses, every case is answerable from the records, and the Corefile binds
// every zone.
func TestKubeDNSZones(t *testing.T) {
	z := nstest.KubeDNSZones(nstest.ZoneOptions{Services: 7, Namespaces: []string{"a", "b"}})
	if len(z.Services) != 7 || z.Services[1].FQDN != "svc-1.b.svc.cluster.local." || z.Services[6].IP.String() != "10.0.1.6" {
		t.Errorf("services: %+v", z.Services)
	}
	for name, text := range z.Files {
		zp := dns.NewZoneParser(strings.NewReader(text), "", name)
		n := 0
		for _, ok := zp.Next(); ok; _, ok = zp.Next() {
			n++
		}
		if err := zp.Err(); err != nil || n == 0 {
			t.Errorf("zone file %s: %d records, %v", name, n, err)
		}
	}
	corefile := z.Corefile("10.0.0.10")
	for _, o := range z.Origins {
		if !strings.Contains(corefile, o+":53 {\n    bind 10.0.0.10\n") {
			t.Errorf("Corefile lacks a block for %s:\n%s", o, corefile)
		}
	}
	want := map[string]struct {
		rcode   int
		answers int
	}{
		"svc-0.a.svc.cluster.local. A":    {dns.RcodeSuccess, 1},
		"svc-0.a.svc.cluster.local. AAAA": {dns.RcodeSuccess, 0},
		"a.svc.cluster.local. A":          {dns.RcodeSuccess, 0},
		"nosuch.a.svc.cluster.local. A":   {dns.RcodeNameError, 0},
		"alias.example.com. A":            {dns.RcodeSuccess, 3},
		"cdn.example.net. A":              {dns.RcodeSuccess, 2},
		"dangling.example.net. A":         {dns.RcodeNameError, 1},
		"large.example.com. A":            {dns.RcodeSuccess, nstest.LargeCount},
		"www.example.org. A":              {dns.RcodeRefused, 0},
	}
	seen := 0
	for _, c := range z.Cases {
		w, ok := want[c.String()]
		if !ok {
			continue
		}
		seen++
		if c.Rcode != w.rcode || len(c.Answer) != w.answers {
			t.Errorf("%s: rcode %s with %d answers, want %s with %d",
				c, dns.RcodeToString[c.Rcode], len(c.Answer), dns.RcodeToString[w.rcode], w.answers)
		}
	}
	if seen != len(want) {
		t.Errorf("found %d of the %d cases looked for", seen, len(want))
	}
}

func TestParseDig(t *testing.T) {
	out := `
; <<>> DiG 9.18.47 <<>> +noall +comments +answer @10.0.0.10 alias.example.com A
;; global options: +cmd
;; Got answer:
;; ->>HEADER<<- opcode: QUERY, status: NOERROR, id: 4242
;; flags: qr aa rd; QUERY: 1, ANSWER: 2, AUTHORITY: 0, ADDITIONAL: 1

;; OPT PSEUDOSECTION:
; EDNS: version: 0, flags:; udp: 1232

;; ANSWER SECTION:
alias.example.com.	300	IN	CNAME	www.example.com.
www.example.com.	300	IN	A	192.0.2.10
`
	rcode, answer, err := nstest.ParseDig(out)
	if err != nil || rcode != dns.RcodeSuccess || len(answer) != 2 || answer[1].(*dns.A).A.String() != "192.0.2.10" {
		t.Errorf("ParseDig = %d, %v, %v", rcode, answer, err)
	}
	if _, _, err := nstest.ParseDig(";; connection timed out; no servers could be reached\n"); err == nil {
		t.Error("ParseDig of a timeout: no error")
	}
}

// hostRun runs a command in the test's own namespace.
func hostRun(name string, args ...string) (string, error) {
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("%s %v: %w\n%s", name, args, err, out)
	}
	return string(out), nil
}

// TestCaseCheck checks that Check accepts the expected reply, or a cache's
// aged copy of it, and rejects each kind of difference.
func TestCaseCheck(t *testing.T) {
	z := nstest.KubeDNSZones(nstest.ZoneOptions{Services: 1})
	chain, _ := z.Case(nstest.ChainName, dns.TypeA)
	nx, _ := z.Case("nosuch.example.com.", dns.TypeA)
	reply := func(c nstest.Case, mod func(*dns.Msg)) *dns.Msg {
		m := new(dns.Msg)
		m.SetReply(c.Question())
		m.Rcode = c.Rcode
		for _, rr := range c.Answer {
			m.Answer = append(m.Answer, dns.Copy(rr))
		}
		if len(c.Answer) == 0 {
			soa, err := dns.NewRR(c.Zone + " 300 IN SOA ns1." + c.Zone + " hostmaster." + c.Zone + " 1 2 3 4 300")
			must(t, err)
			m.Ns = []dns.RR{soa}
		}
		if mod != nil {
			mod(m)
		}
		return m
	}
	for _, tc := range []struct {
		name string
		c    nstest.Case
		mod  func(*dns.Msg)
		ok   bool
	}{
		{"as expected", chain, nil, true},
		{"reordered, aged, upper case", chain, func(m *dns.Msg) {
			slices.Reverse(m.Answer)
			for _, rr := range m.Answer {
				rr.Header().Ttl--
				rr.Header().Name = strings.ToUpper(rr.Header().Name)
			}
		}, true},
		{"negative as expected", nx, nil, true},
		{"wrong rcode", chain, func(m *dns.Msg) { m.Rcode = dns.RcodeServerFailure }, false},
		{"truncated", chain, func(m *dns.Msg) { m.Truncated = true }, false},
		{"record missing", chain, func(m *dns.Msg) { m.Answer = m.Answer[1:] }, false},
		{"record twice", chain, func(m *dns.Msg) { m.Answer = append(m.Answer, m.Answer[0]) }, false},
		{"TTL above the zone's", chain, func(m *dns.Msg) { m.Answer[0].Header().Ttl++ }, false},
		{"other address", chain, func(m *dns.Msg) {
			for _, rr := range m.Answer {
				if a, ok := rr.(*dns.A); ok {
					a.A = net.IPv4(192, 0, 2, 99)
				}
			}
		}, false},
		{"negative without SOA", nx, func(m *dns.Msg) { m.Ns = nil }, false},
	} {
		err := tc.c.Check(reply(tc.c, tc.mod))
		if (err == nil) != tc.ok {
			t.Errorf("%s: Check = %v, want ok=%v", tc.name, err, tc.ok)
		}
	}
}
