package localanswer

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/miekg/dns"

	"github.com/dnsstandby/dnsstandby/corefile"
	"github.com/dnsstandby/dnsstandby/internal/testkit"
)

// hostsTestFile is a hosts file in the shape of AKS's /etc/localdns/hosts.
const hostsTestFile = `# AKS critical FQDNs
10.1.0.1 mcr.microsoft.com
10.1.0.2 Login.MicrosoftOnline.com   login.example.org  # two names, mixed case
10.1.0.3 packages.aks.azure.com
10.1.0.4 packages.aks.azure.com
fd00::3 packages.aks.azure.com
fe80::1%eth0 linklocal.example.org
::ffff:10.1.0.9 mapped.example.org
10.1.0.1 mcr-alias.example.org
not-an-ip bad.example.org
10.1.0.5
10.1.0.6 outside.test.
`

func hostsWrite(t testing.TB, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "hosts")
	if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func hostsNew(t testing.TB, hc corefile.Hosts) *Hosts {
	t.Helper()
	cfg := DefaultHostsConfig()
	cfg.Hosts = hc
	cfg.Logger = testkit.Logger(t)
	h, err := NewHosts(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	return h
}

func hostsQuery(name string, qtype uint16) Request {
	m := new(dns.Msg)
	m.SetQuestion(name, qtype)
	return Request{Msg: m, Client: netip.MustParseAddrPort("10.244.0.5:40000"), Local: netip.MustParseAddrPort("169.254.10.11:53")}
}

// hostsRRs renders records for comparison, one string each.
func hostsRRs(rrs []dns.RR) []string {
	out := make([]string, len(rrs))
	for i, rr := range rrs {
		out[i] = strings.ReplaceAll(rr.String(), "\t", " ")
	}
	return out
}

// TestHostsAnswer checks every kind of answer of the hosts plugin, as
// CoreDNS's ServeDNS makes them.
func TestHostsAnswer(t *testing.T) {
	file := hostsWrite(t, hostsTestFile)
	base := corefile.Hosts{File: file, Zones: []string{"."}, TTL: 5, Reload: 5 * time.Second}
	aks := base
	aks.Fallthrough = []string{"."}
	narrow := base
	narrow.Zones = []string{"example.org.", "microsoft.com."}
	narrow.Inline = []string{"10.9.9.9 inline.example.org mcr.microsoft.com", "10.9.9.8 notinzone.test"}
	narrow.Fallthrough = []string{"microsoft.com."}
	noRev := narrow
	noRev.NoReverse = true

	const pass = "pass"
	tests := []struct {
		name   string
		hosts  corefile.Hosts
		qname  string
		qtype  uint16
		rcode  string   // "pass" when the query is passed on
		answer []string // with AA set whenever rcode is NOERROR
	}{
		{"A", base, "mcr.microsoft.com.", dns.TypeA, "NOERROR", []string{"mcr.microsoft.com. 5 IN A 10.1.0.1"}},
		{"A mixed case: owner is lower case", base, "MCR.Microsoft.COM.", dns.TypeA, "NOERROR", []string{"mcr.microsoft.com. 5 IN A 10.1.0.1"}},
		{"name written in mixed case", base, "login.microsoftonline.com.", dns.TypeA, "NOERROR", []string{"login.microsoftonline.com. 5 IN A 10.1.0.2"}},
		{"second name of a line", base, "login.example.org.", dns.TypeA, "NOERROR", []string{"login.example.org. 5 IN A 10.1.0.2"}},
		{"two addresses in file order", base, "packages.aks.azure.com.", dns.TypeA, "NOERROR",
			[]string{"packages.aks.azure.com. 5 IN A 10.1.0.3", "packages.aks.azure.com. 5 IN A 10.1.0.4"}},
		{"AAAA", base, "packages.aks.azure.com.", dns.TypeAAAA, "NOERROR", []string{"packages.aks.azure.com. 5 IN AAAA fd00::3"}},
		{"IPv6 zone dropped", base, "linklocal.example.org.", dns.TypeAAAA, "NOERROR", []string{"linklocal.example.org. 5 IN AAAA fe80::1"}},
		{"IPv4-mapped is IPv4", base, "mapped.example.org.", dns.TypeA, "NOERROR", []string{"mapped.example.org. 5 IN A 10.1.0.9"}},
		{"NODATA: known name, no AAAA", base, "mcr.microsoft.com.", dns.TypeAAAA, "NOERROR", nil},
		{"NODATA: known name, MX", base, "mcr.microsoft.com.", dns.TypeMX, "NOERROR", nil},
		{"unknown name without fallthrough", base, "unknown.example.org.", dns.TypeA, "SERVFAIL", nil},
		{"unknown type and name without fallthrough", base, "unknown.example.org.", dns.TypeMX, "SERVFAIL", nil},
		{"line with a bad address dropped", base, "bad.example.org.", dns.TypeA, "SERVFAIL", nil},
		{"unknown name with fallthrough", aks, "unknown.example.org.", dns.TypeA, pass, nil},
		{"PTR", base, "1.0.1.10.in-addr.arpa.", dns.TypePTR, "NOERROR",
			[]string{"1.0.1.10.in-addr.arpa. 5 IN PTR mcr.microsoft.com.", "1.0.1.10.in-addr.arpa. 5 IN PTR mcr-alias.example.org."}},
		{"PTR mixed case", base, "2.0.1.10.IN-ADDR.ARPA.", dns.TypePTR, "NOERROR",
			[]string{"2.0.1.10.in-addr.arpa. 5 IN PTR login.microsoftonline.com.", "2.0.1.10.in-addr.arpa. 5 IN PTR login.example.org."}},
		{"PTR IPv6", base, "3.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.d.f.ip6.arpa.", dns.TypePTR, "NOERROR",
			[]string{"3.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.d.f.ip6.arpa. 5 IN PTR packages.aks.azure.com."}},
		{"PTR of an IPv4-mapped name", base, "9.0.0.0.1.0.a.0.f.f.f.f.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.ip6.arpa.", dns.TypePTR, "NOERROR",
			[]string{"9.0.0.0.1.0.a.0.f.f.f.f.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.ip6.arpa. 5 IN PTR mapped.example.org."}},
		{"PTR unknown address passes even without fallthrough", base, "99.0.1.10.in-addr.arpa.", dns.TypePTR, pass, nil},
		{"PTR not a reverse name passes", base, "mcr.microsoft.com.", dns.TypePTR, pass, nil},
		{"PTR malformed passes", base, "1.0.1.10.1.in-addr.arpa.", dns.TypePTR, pass, nil},
		{"A for a name outside the zones passes", narrow, "packages.aks.azure.com.", dns.TypeA, pass, nil},
		{"names outside the zones are not kept", narrow, "1.0.1.10.in-addr.arpa.", dns.TypePTR, "NOERROR",
			[]string{"1.0.1.10.in-addr.arpa. 5 IN PTR mcr.microsoft.com.", "1.0.1.10.in-addr.arpa. 5 IN PTR mcr-alias.example.org."}},
		{"PTR outside the zones is answered", narrow, "2.0.1.10.in-addr.arpa.", dns.TypePTR, "NOERROR",
			[]string{"2.0.1.10.in-addr.arpa. 5 IN PTR login.example.org."}},
		{"file then inline", narrow, "mcr.microsoft.com.", dns.TypeA, "NOERROR",
			[]string{"mcr.microsoft.com. 5 IN A 10.1.0.1", "mcr.microsoft.com. 5 IN A 10.9.9.9"}},
		{"inline PTR", narrow, "9.9.9.10.in-addr.arpa.", dns.TypePTR, "NOERROR",
			[]string{"9.9.9.10.in-addr.arpa. 5 IN PTR inline.example.org.", "9.9.9.10.in-addr.arpa. 5 IN PTR mcr.microsoft.com."}},
		{"inline outside the zones not kept", narrow, "8.9.9.10.in-addr.arpa.", dns.TypePTR, pass, nil},
		{"fallthrough zone", narrow, "other.microsoft.com.", dns.TypeA, pass, nil},
		{"zone without fallthrough", narrow, "other.example.org.", dns.TypeA, "SERVFAIL", nil},
		{"no_reverse: PTR passes", noRev, "1.0.1.10.in-addr.arpa.", dns.TypePTR, pass, nil},
		{"no_reverse: inline PTR passes", noRev, "9.9.9.10.in-addr.arpa.", dns.TypePTR, pass, nil},
		{"no_reverse: A still answered", noRev, "inline.example.org.", dns.TypeA, "NOERROR", []string{"inline.example.org. 5 IN A 10.9.9.9"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := hostsNew(t, tt.hosts)
			req := hostsQuery(tt.qname, tt.qtype)
			m, ok := h.Answer(req)
			if tt.rcode == pass {
				if ok || m != nil {
					t.Fatalf("answered %v, want passed on", m)
				}
				return
			}
			if !ok || m == nil {
				t.Fatal("passed on, want an answer")
			}
			if got := dns.RcodeToString[m.Rcode]; got != tt.rcode {
				t.Errorf("rcode %s, want %s", got, tt.rcode)
			}
			if m.Authoritative != (tt.rcode == "NOERROR") {
				t.Errorf("AA = %v", m.Authoritative)
			}
			if !m.Response || m.Id != req.Msg.Id || !m.RecursionDesired || m.RecursionAvailable {
				t.Errorf("header %+v", m.MsgHdr)
			}
			if len(m.Question) != 1 || m.Question[0] != req.Msg.Question[0] {
				t.Errorf("question %v", m.Question)
			}
			if got := hostsRRs(m.Answer); !slices.Equal(got, tt.answer) {
				t.Errorf("answer\n %q\nwant\n %q", got, tt.answer)
			}
			if len(m.Ns) != 0 || len(m.Extra) != 0 {
				t.Errorf("authority %v additional %v, want none", m.Ns, m.Extra)
			}
		})
	}
}

// TestHostsLimits checks the bounds on what is read and answered.
func TestHostsLimits(t *testing.T) {
	var many strings.Builder
	for i := range 300 {
		fmt.Fprintf(&many, "10.2.%d.%d many.example.org\n", i/100, i%100)
	}
	long := "10.3.0.1 before.example.org\n10.3.0.2 " + strings.Repeat("x", 70000) + "\n10.3.0.3 after.example.org\n"
	tests := []struct {
		name     string
		text     string
		maxFile  int64
		maxRRs   int
		qname    string
		wantRRs  int
		answered bool
	}{
		{"records capped", many.String(), 1 << 20, 100, "many.example.org.", 100, true},
		{"file too large is not read", many.String(), 100, 1024, "many.example.org.", 0, false},
		{"line longer than 64 KiB stops the parse as in CoreDNS", long, 1 << 20, 1024, "before.example.org.", 1, true},
		{"nothing after the long line", long, 1 << 20, 1024, "after.example.org.", 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := DefaultHostsConfig()
			cfg.Hosts = corefile.Hosts{File: hostsWrite(t, tt.text), Zones: []string{"."}, TTL: 5, Fallthrough: []string{"."}}
			cfg.MaxFileSize, cfg.MaxRecords = tt.maxFile, tt.maxRRs
			cfg.Logger = testkit.Logger(t)
			h, err := NewHosts(cfg)
			if err != nil {
				t.Fatal(err)
			}
			m, ok := h.Answer(hostsQuery(tt.qname, dns.TypeA))
			if ok != tt.answered {
				t.Fatalf("answered %v, want %v", ok, tt.answered)
			}
			if ok && len(m.Answer) != tt.wantRRs {
				t.Errorf("%d records, want %d", len(m.Answer), tt.wantRRs)
			}
		})
	}
}

// TestHostsFileKinds checks files that are not plain files: CoreDNS reads
// a directory as empty; a FIFO must not hang the reader; a missing file
// gives the inline entries only.
func TestHostsFileKinds(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, file := range []string{dir, fifo, filepath.Join(dir, "missing")} {
		t.Run(filepath.Base(file), func(t *testing.T) {
			h := hostsNew(t, corefile.Hosts{File: file, Zones: []string{"."}, TTL: 5,
				Inline: []string{"10.0.0.1 inline.example.org"}})
			if m, ok := h.Answer(hostsQuery("inline.example.org.", dns.TypeA)); !ok || len(m.Answer) != 1 {
				t.Errorf("inline entry: %v %v", ok, m)
			}
			if m, ok := h.Answer(hostsQuery("mcr.microsoft.com.", dns.TypeA)); !ok || m.Rcode != dns.RcodeServerFailure {
				t.Errorf("unknown name: %v %v", ok, m)
			}
		})
	}
}

// TestHostsReload checks that the file is read again every Reload when
// it changed, that entries stay when it disappears, and that the reload
// goroutine stops with its context.
func TestHostsReload(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		file := hostsWrite(t, "10.0.0.1 a.example.org\n")
		h := hostsNew(t, corefile.Hosts{File: file, Zones: []string{"."}, TTL: 5, Reload: 5 * time.Second})
		ctx, cancel := context.WithCancel(t.Context())
		if err := h.Start(ctx); err != nil {
			t.Fatal(err)
		}
		if err := h.Start(ctx); err == nil {
			t.Error("second Start: no error")
		}
		addr := func() string {
			m, ok := h.Answer(hostsQuery("a.example.org.", dns.TypeA))
			if !ok || len(m.Answer) == 0 {
				return "none"
			}
			return m.Answer[len(m.Answer)-1].(*dns.A).A.String()
		}
		if got := addr(); got != "10.0.0.1" {
			t.Fatalf("before: %s", got)
		}
		if err := os.WriteFile(file, []byte("10.0.0.22 a.example.org\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		time.Sleep(4 * time.Second)
		synctest.Wait()
		if got := addr(); got != "10.0.0.1" {
			t.Errorf("before the reload interval: %s", got)
		}
		time.Sleep(time.Second)
		synctest.Wait()
		if got := addr(); got != "10.0.0.22" {
			t.Errorf("after the reload interval: %s", got)
		}
		if err := os.Remove(file); err != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Second)
		synctest.Wait()
		if got := addr(); got != "10.0.0.22" {
			t.Errorf("after the file went: %s, want the entries kept", got)
		}
		cancel()
		synctest.Wait() // the goroutine has returned, or the bubble would not be idle
		if err := os.WriteFile(file, []byte("10.0.0.33 a.example.org\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Second)
		synctest.Wait()
		if got := addr(); got != "10.0.0.22" {
			t.Errorf("after cancel: %s, want no more reloads", got)
		}
		h.Close()
	})
}

func TestNewHostsRefuses(t *testing.T) {
	ok := corefile.Hosts{File: "/etc/hosts", Zones: []string{"."}, TTL: 5}
	tests := []struct {
		name string
		mod  func(*HostsConfig)
		want string
	}{
		{"TTL zero", func(c *HostsConfig) { c.Hosts.TTL = 0 }, "localanswer: hosts: Hosts.TTL must be 1 to 65535 seconds, got 0"},
		{"TTL too large", func(c *HostsConfig) { c.Hosts.TTL = 65536 }, "localanswer: hosts: Hosts.TTL must be 1 to 65535 seconds, got 65536"},
		{"negative reload", func(c *HostsConfig) { c.Hosts.Reload = -time.Second }, "localanswer: hosts: Hosts.Reload must not be negative, got -1s"},
		{"no file", func(c *HostsConfig) { c.Hosts.File = "" }, "localanswer: hosts: Hosts.File is empty"},
		{"no file size", func(c *HostsConfig) { c.MaxFileSize = 0 }, "localanswer: hosts: MaxFileSize must be positive, got 0"},
		{"no records", func(c *HostsConfig) { c.MaxRecords = 0 }, "localanswer: hosts: MaxRecords must be positive, got 0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := DefaultHostsConfig()
			cfg.Hosts = ok
			tt.mod(&cfg)
			if _, err := NewHosts(cfg); err == nil || err.Error() != tt.want {
				t.Errorf("error %v, want %q", err, tt.want)
			}
		})
	}
}

// FuzzParseHosts feeds arbitrary hosts files to the parser and the
// answerer: nothing may panic, every name kept is lower case, fully
// qualified and in the zones, and every answer stays within MaxRecords.
func FuzzParseHosts(f *testing.F) {
	f.Add([]byte(hostsTestFile), "mcr.microsoft.com.")
	f.Add([]byte("::1 localhost ip6-localhost\n127.0.0.1\tlocalhost # c\n"), "1.0.0.127.in-addr.arpa.")
	f.Add([]byte("1.2.3.4 A.B.\n1.2.3.4 a.b\n\x00\xff 1.2.3.4 x\n"), "a.b.")
	zones := []string{"example.org.", "0.10.in-addr.arpa.", "."}
	f.Fuzz(func(t *testing.T, data []byte, qname string) {
		for _, z := range zones[:2] {
			tab := parseHosts(strings.NewReader(string(data)), []string{z}, true)
			for _, m := range []map[string][]netip.Addr{tab.name4, tab.name6} {
				for n, as := range m {
					if n != strings.ToLower(dns.Fqdn(n)) || !dns.IsSubDomain(z, n) {
						t.Fatalf("name %q kept for zone %s", n, z)
					}
					for _, a := range as {
						if !a.IsValid() || a.Is4In6() || a.Zone() != "" {
							t.Fatalf("address %v for %q", a, n)
						}
					}
				}
			}
		}
		cfg := DefaultHostsConfig()
		cfg.Hosts = corefile.Hosts{File: "/nonexistent/hosts", Zones: zones[2:], TTL: 1,
			Inline: strings.Split(string(data), "\n")}
		cfg.MaxRecords = 3
		h, err := NewHosts(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := dns.IsDomainName(qname); !ok {
			return
		}
		for _, qt := range []uint16{dns.TypeA, dns.TypeAAAA, dns.TypePTR, dns.TypeMX} {
			if m, ok := h.Answer(hostsQuery(dns.Fqdn(qname), qt)); ok && len(m.Answer) > 3 {
				t.Fatalf("%d records over MaxRecords 3", len(m.Answer))
			}
		}
	})
}
