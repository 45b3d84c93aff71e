package corefile

// Hosts is the hosts plugin of a block, as CoreDNS 1.13.1 reads it. Its
// fields and its parser are being written.
type Hosts struct{}
