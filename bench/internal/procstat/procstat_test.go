package procstat

import (
	"os"
	"testing"
)

func TestParseStatCPU(t *testing.T) {
	// The command name holds a space and a ')', as a process may name itself.
	stat := "4242 (odd) name) S 1 4242 4242 0 -1 4194560 1500 0 0 0 120 35 0 0 20 0 9 0 100 0 0"
	got, err := parseStatCPU(stat)
	if err != nil || got != 155 {
		t.Errorf("parseStatCPU = %d, %v; want 155", got, err)
	}
	if _, err := parseStatCPU("4242 (x) S 1 2"); err == nil {
		t.Error("short stat line parsed")
	}
}

func TestProcessCPUTicksSelf(t *testing.T) {
	if _, err := CPUTicks(os.Getpid()); err != nil {
		t.Fatal(err)
	}
}

const procNetUDP = `   sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode ref pointer drops
  117: 0B00007F:0035 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 41000 2 0000000000000000 12
  118: 0B00007F:0035 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 41001 2 0000000000000000 30
  119: 0C00007F:0035 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 41002 2 0000000000000000 99
`

func TestUDPDrops(t *testing.T) {
	addr, err := procNetAddr("127.0.0.11:53")
	if err != nil || addr != "0B00007F:0035" {
		t.Fatalf("procNetAddr = %q, %v", addr, err)
	}
	got, err := parseUDPDrops(procNetUDP, addr)
	if err != nil || got != 42 {
		t.Errorf("drops = %d, %v; want 42 (two reuseport sockets)", got, err)
	}
	if _, err := parseUDPDrops(procNetUDP, "0D00007F:0035"); err == nil {
		t.Error("drops of an unbound address: want an error")
	}
}

func TestParseSNMP(t *testing.T) {
	snmp := "Ip: Forwarding DefaultTTL\nIp: 1 64\n" +
		"Udp: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors SndbufErrors\nUdp: 100 2 7 90 5 0\n"
	got, err := parseSNMP(snmp, "Udp", "RcvbufErrors")
	if err != nil || got != 5 {
		t.Errorf("RcvbufErrors = %d, %v; want 5", got, err)
	}
	if _, err := parseSNMP(snmp, "Udp", "Nope"); err == nil {
		t.Error("unknown counter: want an error")
	}
}
