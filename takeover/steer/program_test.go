package steer

import (
	"bytes"
	"encoding/binary"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	"github.com/cilium/ebpf/asm"
)

var update = flag.Bool("update", false, "rewrite testdata/program.golden")

// fakeMap stands in for a map in tests that need no kernel: Marshal only
// needs an FD to encode.
type fakeMap int

func (m fakeMap) FD() int { return int(m) }

const (
	fakeConfigFD    = 100
	fakeSockarrayFD = 200
	fakeLiveFD      = 300
)

// encoded returns Program's kernel encoding with fake map FDs, and the
// instructions as marshalled (jumps resolved).
func encoded(t *testing.T) (asm.Instructions, []byte) {
	t.Helper()
	insns := Program()
	if err := insns.AssociateMap(ConfigMap, fakeMap(fakeConfigFD)); err != nil {
		t.Fatal(err)
	}
	if err := insns.AssociateMap(SockarrayMap, fakeMap(fakeSockarrayFD)); err != nil {
		t.Fatal(err)
	}
	if err := insns.AssociateMap(LiveMap, fakeMap(fakeLiveFD)); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := insns.Marshal(&buf, binary.LittleEndian); err != nil {
		t.Fatalf("marshal: %v (a jump label or map reference does not resolve)", err)
	}
	return insns, buf.Bytes()
}

func TestProgramGolden(t *testing.T) {
	got := fmt.Sprintf("%v", Program())
	path := filepath.Join("testdata", "program.golden")
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run `go test -run TestProgramGolden -update` to create it)", err)
	}
	if got != string(want) {
		t.Errorf("Program() changed; if intended, run `go test -run TestProgramGolden -update` and review the diff.\ngot:\n%s", got)
	}
}

func TestProgramDeterministic(t *testing.T) {
	_, a := encoded(t)
	_, b := encoded(t)
	if !bytes.Equal(a, b) {
		t.Fatal("two calls of Program encode differently")
	}
	if n := len(a) / asm.InstructionSize; n > 4096 {
		t.Fatalf("%d instructions: over the 4096 an unprivileged-era kernel accepts", n)
	}
}

// TestProgramShape checks the rules every path must keep, on the
// instruction stream: one exit, at the end, right after r0 = SK_PASS; no
// other write to r0 but helper calls; every map load names a map; every
// call is a helper the program type allows.
func TestProgramShape(t *testing.T) {
	insns, _ := encoded(t)
	exits := 0
	for i, ins := range insns {
		switch {
		case ins.OpCode.JumpOp() == asm.Exit:
			exits++
			if i != len(insns)-1 {
				t.Errorf("insn %d: exit before the end", i)
			}
			prev := insns[i-1]
			if prev.OpCode != asm.Mov.Op(asm.ImmSource) || prev.Dst != asm.R0 || prev.Constant != skPass || prev.Symbol() != "pass" {
				t.Errorf("exit not preceded by `pass: r0 = SK_PASS`: %v", prev)
			}
		case ins.IsBuiltinCall():
			switch asm.BuiltinFunc(ins.Constant) {
			case asm.FnMapLookupElem, asm.FnKtimeGetNs, asm.FnSkSelectReuseport, asm.FnSkbLoadBytesRelative:
			default:
				t.Errorf("insn %d: unexpected helper %v", i, asm.BuiltinFunc(ins.Constant))
			}
		case ins.IsLoadFromMap():
			if ins.Constant != fakeConfigFD && ins.Constant != fakeSockarrayFD && ins.Constant != fakeLiveFD {
				t.Errorf("insn %d: map load of fd %d", i, ins.Constant)
			}
		case ins.Dst == asm.R0 && ins.OpCode.Class().IsALU() && i != len(insns)-2:
			if !(ins.OpCode == asm.Sub.Op(asm.RegSource)) { // heartbeat age
				t.Errorf("insn %d writes r0: %v", i, ins)
			}
		case ins.OpCode.Class().IsJump() && ins.OpCode.JumpOp() != asm.Call && ins.Offset < 0:
			t.Errorf("insn %d jumps backwards: %v", i, ins)
		}
	}
	if exits != 1 {
		t.Errorf("%d exits, want 1", exits)
	}
}

func TestConfigEncoding(t *testing.T) {
	tests := []struct {
		name  string
		c     configValue
		proto []byte // at cfgProbeProto
		addr  []byte // at cfgProbeAddr
		text  string // little-endian hosts: the whole value
	}{
		{"no probe address", configValue{Mode: ToUs, ProbePort: 0x1234, Heartbeat: 0x0102030405060708, Stall: 2e9, Unread: 150e6},
			[]byte{0, 0}, make([]byte, 16),
			"02000000" + "1234" + "0000" + "0807060504030201" + "0094357700000000" + "00000000000000000000000000000000" + "80d1f00800000000"},
		{"IPv4 prober", configValue{Mode: ToPeer, ProbePort: 40000, ProbeAddr: netip.MustParseAddr("169.254.10.11"), Stall: 2e9},
			[]byte{0x08, 0x00}, []byte{169, 254, 10, 11, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
			"01000000" + "9c40" + "0800" + "0000000000000000" + "0094357700000000" + "a9fe0a0b000000000000000000000000" + "0000000000000000"},
		{"IPv6 prober", configValue{ProbePort: 40000, ProbeAddr: netip.MustParseAddr("fd00::a"), Stall: 2e9, Unread: 1},
			[]byte{0x86, 0xdd}, []byte{0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x0a}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := tt.c
			b := c.encode()
			if len(b) != configSize {
				t.Fatalf("%d bytes, want %d", len(b), configSize)
			}
			if got := b[cfgProbePort : cfgProbePort+2]; !bytes.Equal(got, binary.BigEndian.AppendUint16(nil, c.ProbePort)) {
				t.Errorf("probe port bytes %x, want network order, as in the packet", got)
			}
			if got := b[cfgProbeProto : cfgProbeProto+2]; !bytes.Equal(got, tt.proto) {
				t.Errorf("probe EtherType bytes %x, want %x (network order, as skb->protocol)", got, tt.proto)
			}
			if got := b[cfgProbeAddr : cfgProbeAddr+16]; !bytes.Equal(got, tt.addr) {
				t.Errorf("probe address bytes %x, want %x (as in the IP header)", got, tt.addr)
			}
			if binary.NativeEndian.Uint32(b[cfgMode:]) != uint32(c.Mode) ||
				binary.NativeEndian.Uint64(b[cfgHeartbeat:]) != c.Heartbeat ||
				binary.NativeEndian.Uint64(b[cfgStall:]) != c.Stall ||
				binary.NativeEndian.Uint64(b[cfgUnread:]) != c.Unread {
				t.Errorf("layout: %x", b)
			}
			if tt.text != "" && binary.NativeEndian == binary.ByteOrder(binary.LittleEndian) {
				if got := fmt.Sprintf("%x", b); got != tt.text {
					t.Errorf("encoding\n got %s\nwant %s", got, tt.text)
				}
			}
			back, err := decodeConfig(b)
			if err != nil || back != c {
				t.Errorf("decode = %+v, %v; want %+v", back, err, c)
			}
		})
	}
	if _, err := decodeConfig(make([]byte, 8)); err == nil {
		t.Error("decode of 8 bytes: no error")
	}
}
