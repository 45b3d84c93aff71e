// Package deploy holds dnsstandby's deployment files, which live beside
// it: the systemd unit (systemd/, embedded here for the lab), the
// Kubernetes DaemonSet, Prometheus alerts and Grafana dashboard
// (kubernetes/), and the LocalDNS Corefile notes (corefile/). Its tests,
// in tests/ (a module of their own), hold those files to the code: the
// flags the binary accepts, the metrics it exports, the privileges it
// needs.
package deploy
