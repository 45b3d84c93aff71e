// Command reflector is the I/O floor of `make bench-peers`: the cheapest
// thing that can answer a DNS query over UDP from Go. It reads a datagram,
// sets QR and rcode NOERROR in place, and writes it back — no parsing, no
// cache, one goroutine, the standard library's socket calls. A DNS server
// written in Go cannot spend less per query than this on the same path.
package main

import (
	"flag"
	"fmt"
	"net"
	"net/netip"
	"os"
)

// headerLen is the DNS header; anything shorter is not a query to reflect.
const headerLen = 12

func main() {
	listen := flag.String("listen", "127.0.0.14:53", "ADDR:PORT to answer on (UDP)")
	flag.Parse()
	if err := run(*listen); err != nil {
		fmt.Fprintf(os.Stderr, "reflector: %v\n", err)
		os.Exit(1)
	}
}

func run(listen string) error {
	addr, err := netip.ParseAddrPort(listen)
	if err != nil {
		return fmt.Errorf("listen address: %w", err)
	}
	conn, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(addr))
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	defer conn.Close()
	buf := make([]byte, 64<<10)
	for {
		n, from, err := conn.ReadFromUDPAddrPort(buf)
		if err != nil {
			return fmt.Errorf("read: %w", err)
		}
		if n < headerLen {
			continue
		}
		buf[2] |= 0x80  // QR: this is a response
		buf[3] &^= 0x0f // RCODE: NOERROR
		// A failed write (the client's socket buffer full) loses this one
		// answer, as a real server's would; keep serving.
		_, _ = conn.WriteToUDPAddrPort(buf[:n], from)
	}
}
