package main

import (
	"flag"
	"reflect"
	"regexp"
	"strings"

	"github.com/dnsstandby/dnsstandby/daemon"
)

// The parts' Validate methods name what they refuse by the Go field of
// their Config ("hedge: CacheMax must be 1ms to 1m0s", "daemon: Hedge:
// ..."), which is right for a library and wrong for an operator, who set a
// flag. flagNames maps those names to flags from the flag set itself: each
// flag's value points at the field (or fields) of daemon.Config it sets,
// so a new flag is covered as soon as it is bound, and no table of names
// is kept by hand.

// fieldSetter is a flag value that sets fields other than the one its
// pointer would show (a setting spread over several fields): it lists
// them.
type fieldSetter interface{ fields() []any }

// pathSetter is a flag value that sets a field of the elements of a list
// it builds, which no pointer of the flag set shows: it names the field's
// path.
type pathSetter interface{ fieldPaths() []string }

func (r hedgeRate) fields() []any { return []any{&r.c.Rate, &r.c.Burst} }

// fieldPaths: --upstream sets the servers of the route it makes.
func (u *upstreamFlag) fieldPaths() []string { return []string{"Routes.Upstream.Servers"} }

// boundPointers returns the pointers a flag value sets: those a
// fieldSetter lists, the value itself for the flag package's own (a
// *string or *bool in disguise), else the pointers the value's struct
// holds (bounded, parsed, addrList, minTTL).
func boundPointers(v flag.Value) []reflect.Value {
	if fs, ok := v.(fieldSetter); ok {
		var out []reflect.Value
		for _, p := range fs.fields() {
			out = append(out, reflect.ValueOf(p))
		}
		return out
	}
	if _, ok := v.(pathSetter); ok {
		return nil
	}
	rv := reflect.ValueOf(v)
	if rv.Kind() == reflect.Pointer && rv.Elem().Kind() != reflect.Struct {
		return []reflect.Value{rv}
	}
	return structPointers(reflect.Indirect(rv))
}

func structPointers(v reflect.Value) []reflect.Value {
	var out []reflect.Value
	for i := range v.NumField() {
		switch f := v.Field(i); f.Kind() {
		case reflect.Pointer:
			out = append(out, f)
		case reflect.Struct:
			out = append(out, structPointers(f)...)
		}
	}
	return out
}

// configField is a field of daemon.Config, found by walking it.
type configField struct {
	path string // "Hedge.CacheMax"
	addr uintptr
	typ  reflect.Type
}

// walkConfig lists every exported field of v, a struct, and of the
// structs of this module it holds, depth first; and of the structs its
// lists hold, by type alone (address 0).
func walkConfig(v reflect.Value, prefix string, out []configField) []configField {
	for i := range v.NumField() {
		sf := v.Type().Field(i)
		if !sf.IsExported() {
			continue
		}
		f := v.Field(i)
		path := prefix + sf.Name
		var addr uintptr
		if f.CanAddr() {
			addr = f.Addr().Pointer()
		}
		out = append(out, configField{path, addr, f.Type()})
		switch {
		case ours(f.Type()):
			out = walkConfig(f, path+".", out)
		case f.Kind() == reflect.Slice && ours(f.Type().Elem()):
			out = walkConfig(reflect.New(f.Type().Elem()).Elem(), path+".", out)
		}
	}
	return out
}

// ours reports whether t is a struct of this module's.
func ours(t reflect.Type) bool {
	return t.Kind() == reflect.Struct && strings.HasPrefix(t.PkgPath(), "github.com/dnsstandby/dnsstandby/")
}

// flagNames turns the Go field names in an error into the flags that set
// those fields.
type flagNames struct {
	// byName maps a field's path and each of its dotted tails
	// ("Takeover.Machine.HungAfter", "Machine.HungAfter", "HungAfter") to
	// the flag setting it, when only one flag does.
	byName map[string]string
	// fields are the names of every field of daemon.Config: a wrapper
	// such as "Hedge: " naming one is left out of an error.
	fields map[string]bool
}

// newFlagNames binds fs's flags to cfg's fields: fs must be runFlags(cfg).
func newFlagNames(fs *flag.FlagSet, cfg *daemon.Config) *flagNames {
	all := walkConfig(reflect.ValueOf(cfg).Elem(), "", nil)
	n := &flagNames{byName: map[string]string{}, fields: map[string]bool{}}
	bound := map[string]string{} // field path -> flag
	fs.VisitAll(func(f *flag.Flag) {
		if ps, ok := f.Value.(pathSetter); ok {
			for _, p := range ps.fieldPaths() {
				bound[p] = f.Name
			}
		}
		for _, p := range boundPointers(f.Value) {
			for _, cf := range all {
				if cf.addr != 0 && cf.addr == p.Pointer() && sameType(cf.typ, p.Type().Elem()) {
					bound[cf.path] = f.Name
				}
			}
		}
	})
	ambiguous := map[string]bool{}
	for _, cf := range all {
		segs := strings.Split(cf.path, ".")
		for _, s := range segs {
			n.fields[s] = true
		}
		flagName := flagOf(bound, segs)
		if flagName == "" {
			continue
		}
		for i := range segs {
			tail := strings.Join(segs[i:], ".")
			if prev, ok := n.byName[tail]; ok && prev != flagName {
				ambiguous[tail] = true
			}
			n.byName[tail] = flagName
		}
	}
	for tail := range ambiguous {
		delete(n.byName, tail)
	}
	return n
}

// flagOf is the flag that sets the field at path segs: its own, or that
// of a struct holding it (--mirror sets Mirror.Kind and Mirror.DnstapPath).
func flagOf(bound map[string]string, segs []string) string {
	for i := len(segs); i > 0; i-- {
		if f, ok := bound[strings.Join(segs[:i], ".")]; ok {
			return f
		}
	}
	return ""
}

// sameType matches a field with what a flag value points at: the same
// type, or for the flag package's own values (a named string or bool) the
// same kind of non-struct.
func sameType(field, ptr reflect.Type) bool {
	return field == ptr || field.Kind() != reflect.Struct && field.Kind() == ptr.Kind() && ptr.PkgPath() == "flag"
}

var (
	// fieldPath is a Go field name, dotted, with an index: "Listen[0]",
	// "Machine.HungAfter", after a character that cannot be in one.
	fieldPath = regexp.MustCompile(`(^|[^A-Za-z0-9_.\-/])([A-Z][A-Za-z0-9]*(?:\.[A-Z][A-Za-z0-9]*)*)(\[[0-9]+\])?`)
	// pkgPrefix ends the text before a field a package's error starts
	// with: "hedge: Rate must be".
	pkgPrefix = regexp.MustCompile(`(^|\b[a-z]+: )$`)
	// qualified is a field's wrapping of its own package's error,
	// "Anchor: anchor: Kind", which names the field Anchor.Kind.
	qualified = regexp.MustCompile(`\b([A-Z][A-Za-z0-9]*): ([a-z]+): ([A-Z])`)
	// wrapper is a prefix ("daemon: ", "Hedge: ") just before a flag.
	wrapper = regexp.MustCompile(`(?:\b[A-Za-z]+: )+(--[a-z])`)
)

// mixedCase reports whether a word has a capital after its first letter
// and a small letter, as Go names do and neither English words nor
// acronyms (NSID, SERVFAIL) do: MaxTTL, CacheMax.
func mixedCase(w string) bool {
	return strings.ContainsAny(w[1:], "ABCDEFGHIJKLMNOPQRSTUVWXYZ") && strings.ContainsAny(w, "abcdefghijklmnopqrstuvwxyz")
}

// lookup finds the flag of a field path as an error writes it, or, when
// no flag sets that field, of its shorter tails: a part's copy of a
// setting (Responder.Listen is the daemon's Listen) is the flag's.
func (n *flagNames) lookup(path string) (string, bool) {
	for {
		if f, ok := n.byName[path]; ok {
			return f, true
		}
		_, rest, ok := strings.Cut(path, ".")
		if !ok {
			return "", false
		}
		path = rest
	}
}

// rename rewrites an error message for the command line: each Go field a
// flag sets becomes that flag, the package and field prefixes before it
// go, and a list of errors (errors.Join) is one line.
func (n *flagNames) rename(msg string) string {
	msg = strings.ReplaceAll(strings.TrimSpace(msg), "\n", "; ")
	msg = qualified.ReplaceAllStringFunc(msg, func(s string) string {
		m := qualified.FindStringSubmatch(s)
		if strings.ToLower(m[1]) != m[2] {
			return s
		}
		return m[1] + "." + m[3]
	})
	var b strings.Builder
	last := 0
	for _, m := range fieldPath.FindAllStringSubmatchIndex(msg, -1) {
		name := msg[m[4]:m[5]]
		// A word such as "Corefile" is a field only where it reads as
		// one: dotted, indexed, in mixed case (MaxTTL), or where a
		// package's error starts.
		if !strings.Contains(name, ".") && m[6] < 0 && !mixedCase(name) && !pkgPrefix.MatchString(msg[:m[4]]) {
			continue
		}
		f, ok := n.lookup(name)
		if !ok {
			continue
		}
		b.WriteString(msg[last:m[4]])
		b.WriteString("--" + f)
		last = m[1]
	}
	b.WriteString(msg[last:])
	return wrapper.ReplaceAllStringFunc(b.String(), func(s string) string {
		// Only the prefixes that are a package's name or a field's.
		i := strings.LastIndex(s, "--")
		for _, w := range strings.Split(strings.TrimSuffix(s[:i], ": "), ": ") {
			if !n.fields[w] && strings.ToLower(w) != w {
				return s
			}
		}
		return s[i:]
	})
}
