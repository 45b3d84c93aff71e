// Command debcopyright writes the Debian copyright file (DEP-5) of a
// dnsstandby binary: the project's own paragraphs (packaging/deb/copyright),
// then a Files paragraph for each module linked into the binary and one
// for the Go standard library, with their copyright lines, license and
// NOTICE, read from the module cache and GOROOT. A static binary carries
// their code, and their BSD and MIT licenses ask that the notices travel
// with it. scripts/build-deb runs it:
//
//	go run ./packaging/debcopyright packaging/deb/copyright BINARY
package main

import (
	"bytes"
	"debug/buildinfo"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"unicode"
)

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: debcopyright HEAD BINARY")
		os.Exit(2)
	}
	if err := run(os.Stdout, os.Args[1], os.Args[2]); err != nil {
		fmt.Fprintf(os.Stderr, "debcopyright: %v\n", err)
		os.Exit(1)
	}
}

func run(w io.Writer, headPath, binary string) error {
	head, err := os.ReadFile(headPath)
	if err != nil {
		return err
	}
	bi, err := buildinfo.ReadFile(binary)
	if err != nil {
		return fmt.Errorf("%s: %w", binary, err)
	}
	modcache, err := goEnv("GOMODCACHE")
	if err != nil {
		return err
	}
	goroot, err := goEnv("GOROOT")
	if err != nil {
		return err
	}
	var parts []part
	for _, m := range bi.Deps {
		if m.Replace != nil {
			m = m.Replace
		}
		dir := filepath.Join(modcache, escapePath(m.Path)+"@"+m.Version)
		p, err := readPart(dir, m.Path+"/*", fmt.Sprintf("%s %s, compiled into /usr/bin/dnsstandby.", m.Path, m.Version))
		if err != nil {
			return fmt.Errorf("module %s %s: %w", m.Path, m.Version, err)
		}
		parts = append(parts, p)
	}
	std, err := readPart(goroot, "go/src/*", fmt.Sprintf("The Go standard library and runtime, %s, compiled into /usr/bin/dnsstandby.", bi.GoVersion))
	if err != nil {
		return fmt.Errorf("Go standard library: %w", err)
	}
	parts = append(parts, std)
	return write(w, head, parts)
}

// goEnv asks the go command for one of its settings.
func goEnv(name string) (string, error) {
	out, err := exec.Command("go", "env", name).Output()
	if err != nil {
		return "", fmt.Errorf("go env %s: %w", name, err)
	}
	return strings.TrimSpace(string(out)), nil
}

// escapePath is a module path as the module cache spells it: each upper
// case letter as "!" and its lower case.
func escapePath(p string) string {
	var b strings.Builder
	for _, r := range p {
		if unicode.IsUpper(r) {
			b.WriteByte('!')
			r = unicode.ToLower(r)
		}
		b.WriteRune(r)
	}
	return b.String()
}

// part is one Files paragraph.
type part struct {
	files     string
	copyright []string
	license   string // the short name
	text      string // the license's text, for a license Debian has no common copy of
	comment   string
}

// commonLicenses are the licenses /usr/share/common-licenses holds: a
// paragraph names them and points there (the project's own head has the
// Apache-2.0 one).
var commonLicenses = map[string]string{
	"Apache-2.0": "/usr/share/common-licenses/Apache-2.0",
	"MPL-2.0":    "/usr/share/common-licenses/MPL-2.0",
}

// readPart reads the license, copyright lines and NOTICE of the source
// tree in dir.
func readPart(dir, files, what string) (part, error) {
	text, err := readFirst(dir, "LICENSE", "LICENSE.txt", "LICENSE.md", "COPYING")
	if err != nil {
		return part{}, err
	}
	notice, err := readFirst(dir, "NOTICE", "NOTICE.txt", "NOTICE.md")
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return part{}, err
	}
	name, err := classify(text)
	if err != nil {
		return part{}, err
	}
	p := part{files: files, license: name, comment: what}
	if _, common := commonLicenses[name]; !common {
		p.text = text
	}
	p.copyright = append(copyrightLines(text), copyrightLines(notice)...)
	if len(p.copyright) == 0 {
		p.copyright = []string{"the authors of " + strings.TrimSuffix(files, "/*")}
	}
	if notice != "" {
		p.comment += "\n\nIts NOTICE:\n\n" + notice
	}
	return p, nil
}

// readFirst reads the first of names in dir that exists.
func readFirst(dir string, names ...string) (string, error) {
	for _, n := range names {
		b, err := os.ReadFile(filepath.Join(dir, n))
		if err == nil {
			return string(b), nil
		}
		if !errors.Is(err, os.ErrNotExist) {
			return "", err
		}
	}
	return "", fmt.Errorf("none of %s in %s: %w", strings.Join(names, ", "), dir, os.ErrNotExist)
}

// classify names a license text by its DEP-5 short name. An unknown one
// is an error: the build stops until someone reads it.
func classify(text string) (string, error) {
	apache := strings.Contains(text, "Apache License") && strings.Contains(text, "Version 2.0")
	mit := strings.Contains(text, "Permission is hereby granted, free of charge")
	bsd := strings.Contains(text, "Redistribution and use in source and binary forms")
	switch {
	case mit && apache:
		return "Expat and Apache-2.0", nil
	case apache:
		return "Apache-2.0", nil
	case strings.Contains(text, "Mozilla Public License") && strings.Contains(text, "2.0"):
		return "MPL-2.0", nil
	case mit:
		return "Expat", nil
	case bsd && (strings.Contains(text, "Neither the name") || strings.Contains(text, "names of its contributors")):
		return "BSD-3-clause", nil
	case bsd:
		return "BSD-2-clause", nil
	}
	return "", errors.New("license not recognised (want Apache-2.0, MPL-2.0, Expat or BSD)")
}

// copyrightLines are the lines of text that state a copyright: "Copyright"
// then "(c)", "©" or a year; not the license's template ("[yyyy]") or its
// prose about copyright.
func copyrightLines(text string) []string {
	var out []string
	for line := range strings.Lines(text) {
		l := strings.TrimSpace(line)
		if len(l) < len("copyright ") || !strings.EqualFold(l[:len("copyright ")], "copyright ") {
			continue
		}
		rest := strings.TrimSpace(l[len("copyright "):])
		if r := []rune(rest); len(r) > 0 && (unicode.IsDigit(r[0]) || r[0] == '©' || strings.HasPrefix(strings.ToLower(rest), "(c)")) {
			out = append(out, rest)
		}
	}
	return out
}

// write writes head, then the paragraphs, then a standalone License
// paragraph for each common license they name that head does not.
func write(w io.Writer, head []byte, parts []part) error {
	var b bytes.Buffer
	b.Write(bytes.TrimRight(head, "\n"))
	b.WriteString("\n")
	named := map[string]bool{}
	for _, p := range parts {
		fmt.Fprintf(&b, "\nFiles: %s\nCopyright: %s\nLicense: %s\n", p.files, field(strings.Join(p.copyright, "\n")), p.license)
		if p.text != "" {
			b.WriteString(field("\n" + p.text)[1:])
			b.WriteString("\n")
		}
		fmt.Fprintf(&b, "Comment: %s\n", field(p.comment))
		for _, n := range strings.Split(p.license, " and ") {
			named[n] = true
		}
	}
	for _, name := range []string{"Apache-2.0", "MPL-2.0"} {
		if named[name] && !bytes.Contains(head, []byte("\nLicense: "+name+"\n")) {
			fmt.Fprintf(&b, "\nLicense: %s\n On Debian systems, the complete text of this license can be found in\n %q.\n", name, commonLicenses[name])
		}
	}
	_, err := w.Write(b.Bytes())
	return err
}

// field formats a multi-line field value as DEP-5 wants: its first line
// after the field name, each further line indented by one space, an empty
// line as " .".
func field(v string) string {
	lines := strings.Split(strings.TrimRight(v, "\n \t"), "\n")
	for i := 1; i < len(lines); i++ {
		l := strings.TrimRight(lines[i], " \t")
		if l == "" {
			l = "."
		}
		lines[i] = " " + l
	}
	return strings.Join(lines, "\n")
}
