package deploy

import _ "embed" // the unit files, for tests and the lab

// SystemdUnit is deploy/systemd/dnsstandby.service, as installed on nodes.
//
//go:embed systemd/dnsstandby.service
var SystemdUnit string

// SystemdDefaults is deploy/systemd/dnsstandby.default, the example
// /etc/default/dnsstandby.
//
//go:embed systemd/dnsstandby.default
var SystemdDefaults string
