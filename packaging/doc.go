// Package packaging holds what dnsstandby is shipped in besides the bare
// binary: the Debian package (nfpm.yaml; deb/: maintainer scripts, the
// DEP-5 copyright's head, lintian overrides; debcopyright, which adds the
// linked modules' paragraphs; built by `make deb`), the container image
// (Containerfile, `make image`), and tools/, a module of its own that pins
// nfpm. Its tests run the Makefile's release, deb and image targets and
// check what comes out: the binaries static, stamped and run on each
// architecture (scripts/release-check, qemu for the foreign ones),
// SHA256SUMS, the package's files, control fields, changelog, copyright,
// conffile and maintainer scripts, lintian's verdict, the image's config
// and its entrypoint run. docs/install.md says how to use each.
package packaging
