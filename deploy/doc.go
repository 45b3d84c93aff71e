// Package deploy holds dnsstandby's deployment files, embeds the systemd
// unit for the lab, and tests the files, which
// live beside it: the systemd unit (systemd/), the Kubernetes DaemonSet,
// Prometheus alerts and Grafana dashboard (kubernetes/), and the LocalDNS
// Corefile notes (corefile/). The tests hold those files to the code: the
// flags the binary accepts, the metrics it exports, the privileges it
// needs.
package deploy
