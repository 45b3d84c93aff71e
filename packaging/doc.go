// Package packaging holds what dnsstandby is shipped in besides the bare
// binary: the Debian package (nfpm.yaml, deb/ maintainer scripts, built by
// `make deb`), the container image (Containerfile, `make image`), and
// tools/, a module of its own that pins nfpm. Its tests run the Makefile's
// release, deb and image targets and check what comes out: the binaries
// static and stamped, SHA256SUMS, the package's files, control fields,
// conffile and maintainer scripts, the image's config and its entrypoint
// run. docs/install.md says how to use each.
package packaging
