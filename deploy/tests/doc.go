// Package tests holds deploy/'s tests: they hold the deployment files to
// the code (the flags the binary accepts, the metrics it exports, the
// privileges it needs).
//
// They are a module of their own because they read PromQL with
// Prometheus's parser (github.com/prometheus/prometheus/promql/parser),
// whose module would raise the main module's golang.org/x/net,
// golang.org/x/sys and prometheus/common and bring Prometheus's
// dependencies along; and because they render kustomize overlays of
// deploy/kubernetes with kustomize's own library
// (sigs.k8s.io/kustomize/api). The package deploy itself stays in the
// main module, where the lab imports it. The dnsstandby binary the tests run is built
// in the main module, with its own dependency versions.
package tests
