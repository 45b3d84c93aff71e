module github.com/dnsstandby/dnsstandby/bench

go 1.26.8

replace github.com/dnsstandby/dnsstandby => ../

require (
	github.com/dnsstandby/dnsstandby v0.0.0-00010101000000-000000000000
	github.com/miekg/dns v1.1.73
	golang.org/x/sys v0.48.0
)

require (
	github.com/vishvananda/netlink v1.3.1 // indirect
	github.com/vishvananda/netns v0.0.5 // indirect
	golang.org/x/net v0.59.0 // indirect
)
