// Package gendoc keeps the parts of the project's documents that are made
// from the code (flag tables, metric tables, sample output) in step with
// it. A generated part sits between two marker lines in a Markdown file:
//
//	<!-- generated NAME: do not edit; `make docs` rewrites it -->
//	...
//	<!-- end generated NAME -->
//
// A test in the package that owns the facts renders the part and calls
// Check: it fails when the document's copy differs, and rewrites the copy
// instead when DNSSTANDBY_UPDATE_DOCS=1 (what `make docs` sets).
package gendoc

import (
	"bytes"
	"fmt"
	"os"
	"testing"
)

// UpdateEnv names the environment variable that makes Check rewrite
// documents instead of comparing them.
const UpdateEnv = "DNSSTANDBY_UPDATE_DOCS"

func begin(name string) string {
	return "<!-- generated " + name + ": do not edit; `make docs` rewrites it -->\n"
}

func end(name string) string { return "<!-- end generated " + name + " -->\n" }

// Replace returns doc with the part called name set to body (a trailing
// newline is added when missing), and the part's current body.
func Replace(doc []byte, name, body string) (out []byte, old string, err error) {
	b, e := []byte(begin(name)), []byte(end(name))
	i := bytes.Index(doc, b)
	if i < 0 {
		return nil, "", fmt.Errorf("generated part %q: no line %q", name, bytes.TrimSpace(b))
	}
	if bytes.Count(doc, b) > 1 {
		return nil, "", fmt.Errorf("generated part %q: marked twice", name)
	}
	start := i + len(b)
	j := bytes.Index(doc[start:], e)
	if j < 0 {
		return nil, "", fmt.Errorf("generated part %q: no line %q after its start", name, bytes.TrimSpace(e))
	}
	body = withNewline(body)
	old = string(doc[start : start+j])
	out = append(append(append([]byte{}, doc[:start]...), body...), doc[start+j:]...)
	return out, old, nil
}

// Check compares the part called name of the document at path with body,
// or rewrites it when UpdateEnv is 1.
func Check(t testing.TB, path, name, body string) {
	t.Helper()
	doc, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	out, old, err := Replace(doc, name, body)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if os.Getenv(UpdateEnv) == "1" {
		if !bytes.Equal(out, doc) {
			if err := os.WriteFile(path, out, 0o644); err != nil {
				t.Fatal(err)
			}
			t.Logf("%s: rewrote generated part %q", path, name)
		}
		return
	}
	if !bytes.Equal(out, doc) {
		t.Errorf("%s: generated part %q differs from the code (run `make docs`, then review the diff)\nin the document:\n%s\nfrom the code:\n%s", path, name, old, withNewline(body))
	}
}

func withNewline(s string) string {
	if s != "" && s[len(s)-1] != '\n' {
		return s + "\n"
	}
	return s
}
