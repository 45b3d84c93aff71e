package takeover

import (
	"context"
	"net/netip"
	"sync/atomic"
	"syscall"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dnsstandby/dnsstandby/takeover/anchor"
	"github.com/dnsstandby/dnsstandby/takeover/dnat"
	"github.com/dnsstandby/dnsstandby/takeover/peer"
	"github.com/dnsstandby/dnsstandby/takeover/steer"
)

// What the Controller needs of its parts, and no more: Start wires the
// real ones (anchor.Anchor, steer.Steerer, peer.Watcher, peer.Prober,
// peer.Process, dnat.Flows); the controller's unit test drives fakes.
type (
	// anchorPart keeps the listen addresses local (*anchor.Anchor).
	anchorPart interface {
		prometheus.Collector
		Ready() bool
		Close() error
	}
	// steering steers the reuseport groups (*steer.Steerer). The
	// controller ends it with Leave, never Close: the programs stay
	// attached in their last mode.
	steering interface {
		prometheus.Collector
		Level() steer.Level
		Why() string
		AddGroup(name string, our syscall.RawConn, udp bool) error
		SetMode(steer.Mode) error
		SetProbe(src netip.AddrPort) error
		Heartbeat() error
		Reads(name string) (*atomic.Uint64, error)
		SetReadTest(on bool) error
		Adopt(name string, fd int) (slot int, err error)
		ClearPeers(name string) error
		Leave() error
	}
	// peerWatch reports LocalDNS's sockets (*peer.Watcher).
	peerWatch interface {
		Current() peer.State
		Updates() <-chan peer.State
		Close() error
	}
	// prober asks LocalDNS whether it answers (*peer.Prober).
	prober interface {
		Probe(context.Context) peer.ProbeResult
		Source() netip.AddrPort
		Close() error
	}
	// peerProcess is a LocalDNS process whose sockets can be duplicated
	// (*peer.Process).
	peerProcess interface {
		DupSocket(inode uint64) (int, error)
		Close() error
	}
)

// parts makes the Controller's parts.
type parts struct {
	startAnchor func(context.Context, anchor.Config) (anchorPart, error)
	newSteering func(steer.Config) (steering, error)
	startWatch  func(context.Context, peer.WatcherConfig) (peerWatch, error)
	newProber   func(peer.ProbeConfig) (prober, error)
	openProcess func(pid int) (peerProcess, error)
	socketInode func(syscall.RawConn) (uint64, error)
	flows       func() ([]dnat.Flow, error) // conntrack, for the nat detector
	// clearFlows deletes the conntrack entries of the listen addresses,
	// once the nat fallback is gone; nil in tests that do not look.
	clearFlows func([]netip.AddrPort) (int, error)
}

// realParts are the parts of a running dnsstandby. Each constructor's
// typed nil is turned into an untyped one on error.
func realParts() parts {
	return parts{
		startAnchor: func(ctx context.Context, cfg anchor.Config) (anchorPart, error) {
			a, err := anchor.Start(ctx, cfg)
			if err != nil {
				return nil, err
			}
			return a, nil
		},
		newSteering: func(cfg steer.Config) (steering, error) {
			s, err := steer.New(cfg)
			if err != nil {
				return nil, err
			}
			return s, nil
		},
		startWatch: func(ctx context.Context, cfg peer.WatcherConfig) (peerWatch, error) {
			w, err := peer.StartWatcher(ctx, cfg)
			if err != nil {
				return nil, err
			}
			return w, nil
		},
		newProber: func(cfg peer.ProbeConfig) (prober, error) {
			p, err := peer.NewProber(cfg)
			if err != nil {
				return nil, err
			}
			return p, nil
		},
		openProcess: func(pid int) (peerProcess, error) {
			p, err := peer.OpenProcess(pid)
			if err != nil {
				return nil, err
			}
			return p, nil
		},
		socketInode: peer.SocketInode,
		flows:       dnat.Flows,
		clearFlows:  dnat.ClearListenFlows,
	}
}
