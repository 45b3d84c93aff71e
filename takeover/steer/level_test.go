package steer

import (
	"errors"
	"net"
	"net/netip"
	"strings"
	"testing"
)

func TestParseLevel(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Level
		auto bool
		err  bool
	}{
		{"auto", Adopt, true, false},
		{"", Adopt, true, false},
		{" AUTO ", Adopt, true, false},
		{"adopt", Adopt, false, false},
		{"Own", Own, false, false},
		{"off", Off, false, false},
		{"none", Off, false, true},
		{"adopt,own", Off, false, true},
	} {
		l, auto, err := parseWant(tc.in)
		if pl, perr := ParseLevel(tc.in); pl != l || (perr == nil) != (err == nil) {
			t.Errorf("ParseLevel(%q) = %v, %v; parseWant gives %v, %v", tc.in, pl, perr, l, err)
		}
		if (err != nil) != tc.err || (err != nil && !errors.Is(err, ErrBadLevel)) {
			t.Errorf("ParseLevel(%q) error %v, want error %v", tc.in, err, tc.err)
			continue
		}
		if err == nil && (l != tc.want || auto != tc.auto) {
			t.Errorf("ParseLevel(%q) = %v, auto %v; want %v, auto %v", tc.in, l, auto, tc.want, tc.auto)
		}
	}
}

func TestNames(t *testing.T) {
	for l, want := range map[Level]string{Off: "off", Own: "own", Adopt: "adopt", 9: "level(9)"} {
		if l.String() != want {
			t.Errorf("Level(%d) = %q, want %q", int(l), l, want)
		}
	}
	for m, want := range map[Mode]string{Hash: "hash", ToPeer: "to-peer", ToUs: "to-us", 9: "mode(9)"} {
		if m.String() != want {
			t.Errorf("Mode(%d) = %q, want %q", uint32(m), m, want)
		}
	}
}

func TestEffectiveMode(t *testing.T) {
	for _, tc := range []struct {
		m    Mode
		l    Level
		want Mode
	}{
		{ToUs, Adopt, ToUs}, {ToPeer, Adopt, ToPeer}, {Hash, Adopt, Hash},
		{ToUs, Own, ToUs}, {ToPeer, Own, Hash}, {Hash, Own, Hash},
		{ToUs, Off, Hash}, {ToPeer, Off, Hash},
	} {
		if got := tc.m.effective(tc.l); got != tc.want {
			t.Errorf("%v at %v = %v, want %v", tc.m, tc.l, got, tc.want)
		}
	}
}

func TestDecide(t *testing.T) {
	ok := func() error { return nil }
	fail := func(msg string) func() error { return func() error { return errors.New(msg) } }
	bpfNotCalled := func() error { t.Error("bpf probed at Off"); return nil }
	for _, tc := range []struct {
		name    string
		max     Level
		auto    bool
		p       probes
		want    Level
		whyHas  []string
		whyLack []string
	}{
		{"all", Adopt, true, probes{ok, ok, ok}, Adopt, []string{"adopt: best available"}, nil},
		{"adopt asked", Adopt, false, probes{ok, ok, ok}, Adopt, []string{"requested"}, nil},
		{"no pidfd_getfd", Adopt, true, probes{ok, fail("pidfd_getfd unsupported (Linux 5.6+): function not implemented"), ok}, Own,
			[]string{"own: adopt not possible: pidfd_getfd unsupported"}, nil},
		{"no ptrace", Adopt, true, probes{ok, ok, fail("no CAP_SYS_PTRACE")}, Own, []string{"adopt not possible: no CAP_SYS_PTRACE"}, nil},
		{"no bpf", Adopt, true, probes{fail("no CAP_BPF/CAP_SYS_ADMIN"), ok, ok}, Off, []string{"off: own and adopt not possible: no CAP_BPF"}, nil},
		{"own asked", Own, false, probes{ok, fail("x"), fail("y")}, Own, []string{"own: requested"}, []string{"x", "y"}},
		{"off asked", Off, false, probes{bpfNotCalled, ok, ok}, Off, []string{"off: requested"}, nil},
	} {
		l, why := decide(tc.max, tc.auto, tc.p)
		if l != tc.want {
			t.Errorf("%s: level %v, want %v (%s)", tc.name, l, tc.want, why)
		}
		for _, s := range tc.whyHas {
			if !strings.Contains(why, s) {
				t.Errorf("%s: why %q lacks %q", tc.name, why, s)
			}
		}
		for _, s := range tc.whyLack {
			if strings.Contains(why, s) {
				t.Errorf("%s: why %q has %q", tc.name, why, s)
			}
		}
	}
}

func TestNewRejectsBadConfig(t *testing.T) {
	tests := []struct {
		name    string
		change  func(*Config)
		wantIs  error
		wantErr string
	}{
		{"bad want", func(c *Config) { c.Want = "sometimes" }, ErrBadLevel, "steer: Want"},
		{"negative stall", func(c *Config) { c.Want, c.StallAfter = WantOff, -1 }, nil, "steer: StallAfter must be positive, got -1ns"},
		{"zero stall", func(c *Config) { c.Want, c.StallAfter = WantOff, 0 }, nil, "steer: StallAfter must be positive, got 0s"},
		{"zero unread limit", func(c *Config) { c.Want, c.UnreadAfter = WantOff, 0 }, nil, "steer: UnreadAfter must be positive, got 0s"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := DefaultConfig()
			tt.change(&cfg)
			_, err := New(cfg)
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) || (tt.wantIs != nil && !errors.Is(err, tt.wantIs)) {
				t.Errorf("New: %v, want an error containing %q", err, tt.wantErr)
			}
		})
	}
}

// At Off every call is a no-op that succeeds, except Adopt, and nothing
// touches the kernel's BPF.
func TestOff(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Want = WantOff
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if s.Level() != Off || !strings.Contains(s.Why(), "requested") {
		t.Fatalf("level %v, why %q", s.Level(), s.Why())
	}
	conn, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	rc, err := conn.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	for _, err := range []error{s.AddGroup("udp", rc, true), s.SetMode(ToUs), s.SetProbe(netip.MustParseAddrPort("127.0.0.1:1")), s.Heartbeat(), s.ClearPeers("udp")} {
		if err != nil {
			t.Errorf("at Off: %v", err)
		}
	}
	if s.Effective() != Hash || s.Mode() != ToUs {
		t.Errorf("mode %v effective %v; want to-us, hash", s.Mode(), s.Effective())
	}
	if _, err := s.Adopt("udp", 0); !errors.Is(err, ErrNotAdopt) {
		t.Errorf("Adopt at Off: %v, want ErrNotAdopt", err)
	}
	if err := s.Close(); err != nil {
		t.Error(err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if err := s.SetMode(Hash); !errors.Is(err, ErrClosed) {
		t.Errorf("SetMode after Close: %v, want ErrClosed", err)
	}
}
