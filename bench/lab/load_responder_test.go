package lab

import (
	"context"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"os/signal"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/miekg/dns"
	"golang.org/x/sys/unix"
)

// loadResponderEnv, when set to ADDR:PORT, makes TestLoadResponderHelper the
// test responder: the test binary re-executes itself with it in the server
// namespace, so the responder's CPU is not the load's.
const loadResponderEnv = "LAB_LOAD_TEST_RESPONDER"

// The test responder's zone: names under loadTestNX are NXDOMAIN, names
// whose first label is "servfail" get SERVFAIL, every other name has one
// A record (and no AAAA). Names whose first label is "twice" are answered
// twice, as a client beside a hedging server gets them; names whose first
// label is "wrongq" get a reply for another name with the query's ID
// first, then their answer.
const (
	loadTestZone = "lab.test."
	loadTestNX   = "nx.lab.test."
)

// TestLoadResponderHelper is not a test: it is the responder process of
// TestLoadRealRun. It listens on two SO_REUSEPORT sockets at one address,
// answering with NSID localdns-pod on one and dnsstandby on the other (the
// kernel's hash spreads the load's sockets over both), and drops every
// query while dropping is on: SIGUSR1 turns it on, SIGUSR2 off.
func TestLoadResponderHelper(t *testing.T) {
	addr := os.Getenv(loadResponderEnv)
	if addr == "" {
		t.Skip("the responder process of TestLoadRealRun; runs only as its child")
	}
	var dropping atomic.Bool
	sigs := make(chan os.Signal, 16)
	signal.Notify(sigs, syscall.SIGUSR1, syscall.SIGUSR2)
	go func() {
		for s := range sigs {
			dropping.Store(s == syscall.SIGUSR1)
		}
	}()
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEPORT, 1)
		})
		if err != nil {
			return err
		}
		return serr
	}}
	for _, nsid := range []string{LoadNSIDLocalDNS, LoadNSIDStandby} {
		pc, err := lc.ListenPacket(context.Background(), "udp", addr)
		if err != nil {
			fmt.Fprintln(os.Stderr, "listen:", err)
			os.Exit(2)
		}
		go loadTestServe(pc, hex.EncodeToString([]byte(nsid)), &dropping)
	}
	fmt.Println("ready")
	select {} // until killed
}

func loadTestServe(pc net.PacketConn, nsidHex string, dropping *atomic.Bool) {
	buf := make([]byte, 4096)
	for {
		n, from, err := pc.ReadFrom(buf)
		if err != nil {
			fmt.Fprintln(os.Stderr, "read:", err)
			os.Exit(2)
		}
		if dropping.Load() {
			continue
		}
		q := new(dns.Msg)
		if q.Unpack(buf[:n]) != nil || len(q.Question) != 1 {
			continue
		}
		r := loadTestAnswer(q, nsidHex)
		out, err := r.Pack()
		if err != nil {
			continue
		}
		switch strings.ToLower(strings.SplitN(q.Question[0].Name, ".", 2)[0]) {
		case "twice":
			pc.WriteTo(out, from)
		case "wrongq":
			w := r.Copy()
			w.Question[0].Name = "other." + loadTestZone
			if b, err := w.Pack(); err == nil {
				pc.WriteTo(b, from)
			}
		}
		pc.WriteTo(out, from)
	}
}

// loadTestAnswer is the responder's reply to q.
func loadTestAnswer(q *dns.Msg, nsidHex string) *dns.Msg {
	r := new(dns.Msg)
	r.SetReply(q)
	r.Authoritative = true
	qn := strings.ToLower(q.Question[0].Name)
	switch {
	case strings.HasPrefix(qn, "servfail."):
		r.Rcode = dns.RcodeServerFailure
		r.Authoritative = false
	case dns.IsSubDomain(loadTestNX, qn):
		r.Rcode = dns.RcodeNameError
	case !dns.IsSubDomain(loadTestZone, qn):
		r.Rcode = dns.RcodeRefused
		r.Authoritative = false
	case q.Question[0].Qtype == dns.TypeA:
		rr, _ := dns.NewRR(q.Question[0].Name + " 30 IN A 192.0.2.1")
		r.Answer = append(r.Answer, rr)
	}
	if o := q.IsEdns0(); o != nil {
		opt := &dns.OPT{Hdr: dns.RR_Header{Name: ".", Rrtype: dns.TypeOPT}}
		opt.SetUDPSize(1232)
		for _, e := range o.Option {
			if e.Option() == dns.EDNS0NSID {
				opt.Option = append(opt.Option, &dns.EDNS0_NSID{Code: dns.EDNS0NSID, Nsid: nsidHex})
			}
		}
		r.Extra = append(r.Extra, opt)
	}
	return r
}
