package main

// The man page dnsstandby(8), the bash completion and the flag table of
// docs/operating.md are made here from one walk of the commands and their
// flag sets (commands, in main.go), so that none of them can disagree
// with the binary or with each other. `make deb` runs the hidden commands
// gen-man and gen-completion (scripts/build-deb); TestFlagsDocs keeps the
// table.

import (
	"flag"
	"fmt"
	"io"
	"reflect"
	"strings"

	"github.com/dnsstandby/dnsstandby/internal/buildinfo"
)

// flagDoc is one flag as the documents show it.
type flagDoc struct {
	name  string
	arg   string // the value's placeholder (ADDR:PORT, DURATION); "" for a bool flag
	usage string // the help text, the placeholder's backquotes removed
	def   string // the default; "" when it is the zero value, which -h does not show either
}

// commandDoc is a command with its flags, in name order (as -h lists them).
type commandDoc struct {
	command
	flags []flagDoc
}

// commandDocs walks every command's flag set.
func commandDocs() []commandDoc {
	var docs []commandDoc
	for _, c := range commands() {
		d := commandDoc{command: c}
		if c.flags != nil {
			c.flags().VisitAll(func(f *flag.Flag) { d.flags = append(d.flags, describeFlag(f)) })
		}
		docs = append(docs, d)
	}
	return docs
}

// argNamer is a flag value that names what it takes, where the help text
// has no `PLACEHOLDER` of its own.
type argNamer interface{ argName() string }

func (bounded[T]) argName() string {
	var v T
	if _, ok := any(v).(int); ok {
		return "N"
	}
	return "DURATION"
}

func (minTTL) argName() string    { return "DURATION" }
func (hedgeRate) argName() string { return "N" }

func describeFlag(f *flag.Flag) flagDoc {
	arg, usage := flag.UnquoteUsage(f)
	if b, ok := f.Value.(interface{ IsBoolFlag() bool }); ok && b.IsBoolFlag() {
		arg = ""
	} else if n, ok := f.Value.(argNamer); ok && arg == "value" {
		arg = n.argName()
	} else if arg == "string" && strings.HasPrefix(f.DefValue, "/") {
		// A string whose default is an absolute path takes a path.
		arg = "PATH"
	} else if arg != "" && strings.ToLower(arg) == arg {
		arg = strings.ToUpper(arg) // flag's own: duration, int, string, value
	}
	d := flagDoc{name: f.Name, arg: arg, usage: usage, def: f.DefValue}
	if isZeroValue(f) {
		d.def = ""
	}
	return d
}

// isZeroValue reports whether f's default is its type's zero value, the
// rule flag.PrintDefaults uses to leave a default out.
func isZeroValue(f *flag.Flag) bool {
	typ := reflect.TypeOf(f.Value)
	var z reflect.Value
	if typ.Kind() == reflect.Pointer {
		z = reflect.New(typ.Elem())
	} else {
		z = reflect.Zero(typ)
	}
	v, ok := z.Interface().(flag.Value)
	return ok && f.DefValue == v.String()
}

// isPath reports whether a flag's value names a file or directory, for
// the completion to offer file names.
func (f flagDoc) isPath() bool {
	return strings.Contains(f.arg, "PATH") || strings.Contains(f.arg, "FILE")
}

// writeFlagTable writes the Markdown table of one command's flags.
func writeFlagTable(w io.Writer, c commandDoc) {
	cell := func(s string) string { return strings.ReplaceAll(s, "|", `\|`) }
	fmt.Fprintln(w, "| Flag | Default | Meaning |")
	fmt.Fprintln(w, "|---|---|---|")
	for _, f := range c.flags {
		name := "--" + f.name
		if f.arg != "" {
			name += " " + f.arg
		}
		def := ""
		if f.def != "" {
			def = "`" + f.def + "`"
		}
		fmt.Fprintf(w, "| `%s` | %s | %s |\n", name, cell(def), cell(f.usage))
	}
}

// envHelp says how flags are given besides the command line.
const envHelp = "Every flag may also be set as the environment variable DNSSTANDBY_<NAME>, the name upper-cased with dashes as underscores (--listen: DNSSTANDBY_LISTEN). The command line wins over the environment."

// writeMan writes dnsstandby(8) in roff (man macros). The version and
// date in its title are the build's (the commit's day), so that one
// commit makes one page.
func writeMan(w io.Writer, docs []commandDoc, info buildinfo.Info) {
	date := info.Time
	if len(date) >= len("2006-01-02") {
		date = date[:len("2006-01-02")]
	}
	fmt.Fprintf(w, ".TH DNSSTANDBY 8 %q %q \"System Administration\"\n", date, "dnsstandby "+info.Version)
	// Ragged right and no hyphenation: the text is full of flag names,
	// addresses and paths, which neither justify nor hyphenate well.
	fmt.Fprintln(w, ".ad l\n.nh")
	fmt.Fprintln(w, ".SH NAME")
	fmt.Fprintln(w, `dnsstandby \- standby DNS responder beside the node-local DNS cache`)
	fmt.Fprintln(w, ".SH SYNOPSIS")
	fmt.Fprintln(w, ".B dnsstandby\n.I command\n.RI [ flags ]")
	fmt.Fprintln(w, ".SH DESCRIPTION")
	fmt.Fprintln(w, roffText("dnsstandby keeps a Kubernetes node's pod and node DNS answering while the node-local DNS cache (AKS LocalDNS, CoreDNS on 169.254.10.10:53 and 169.254.10.11:53) crashes, hangs or restarts: it shares LocalDNS's sockets, mirrors its answers into a cache of its own, and takes the traffic over while LocalDNS is down."))
	fmt.Fprintln(w, ".PP")
	fmt.Fprintln(w, roffText("A flag is written --name VALUE or --name=VALUE (one dash works too); a bool flag takes no value (--name=false turns it off). "+envHelp))
	fmt.Fprintln(w, ".SH COMMANDS")
	for _, c := range docs {
		fmt.Fprintf(w, ".TP\n.B %s\n%s\n", c.name, roffText(c.summary))
	}
	fmt.Fprintln(w, ".SH OPTIONS")
	for _, c := range docs {
		if len(c.flags) == 0 {
			continue
		}
		fmt.Fprintf(w, ".SS \"dnsstandby %s\"\n", c.name)
		for _, f := range c.flags {
			fmt.Fprintf(w, ".TP\n\\fB%s\\fR", roffOption("--"+f.name))
			if f.arg != "" {
				fmt.Fprintf(w, " \\fI%s\\fR", roffOption(f.arg))
			}
			text := roffText(f.usage)
			if f.def != "" {
				// A long path, or a list of them, may break after a
				// slash or a comma (\: is a break point).
				def := strings.NewReplacer(",", `,\:`, "/", `/\:`).Replace(roffText(f.def))
				text += " (default: " + def + ")"
			}
			fmt.Fprintf(w, "\n%s\n", text)
		}
	}
	fmt.Fprintln(w, ".SH EXIT STATUS")
	fmt.Fprintf(w, ".TP\n.B %d\nsuccess; for check, every check passed\n", exitOK)
	fmt.Fprintf(w, ".TP\n.B %d\n%s\n", exitFail, roffText("failure: run stopped on an error or found another dnsstandby holding the lock; status, hold or release could not reach the daemon; for check, some check warned"))
	fmt.Fprintf(w, ".TP\n.B %d\n%s\n", exitUsage, roffText("a bad flag, value or environment variable, or a configuration that cannot start; for check, some check failed"))
	fmt.Fprintln(w, ".SH FILES")
	fmt.Fprintln(w, ".TP\n.I /etc/default/dnsstandby")
	fmt.Fprintln(w, roffText("DNSSTANDBY_OPTS, the flags the unit gives dnsstandby run, and any DNSSTANDBY_<NAME> variables."))
	fmt.Fprintln(w, ".TP\n.I /usr/lib/systemd/system/dnsstandby.service")
	fmt.Fprintln(w, roffText("the systemd unit; installed disabled: systemctl enable --now dnsstandby starts it."))
	fmt.Fprintln(w, ".SH SEE ALSO")
	fmt.Fprintln(w, `.BR systemctl (1),`)
	fmt.Fprintln(w, `.BR journalctl (1),`)
	fmt.Fprintln(w, roffText("and /usr/share/doc/dnsstandby; https://github.com/dnsstandby/dnsstandby"))
}

// roffText escapes running text for roff: backslashes, a leading control
// character, and everything outside ASCII as a named glyph.
func roffText(s string) string {
	var b strings.Builder
	for _, r := range s {
		switch {
		case r == '\\':
			b.WriteString(`\e`)
		case r > 0x7e:
			fmt.Fprintf(&b, `\[u%04X]`, r)
		default:
			b.WriteRune(r)
		}
	}
	out := b.String()
	if strings.HasPrefix(out, ".") || strings.HasPrefix(out, "'") {
		out = `\&` + out
	}
	return out
}

// roffOption escapes an option or its placeholder: its dashes are minus
// signs, which a reader can paste into a shell.
func roffOption(s string) string {
	return strings.ReplaceAll(roffText(s), "-", `\-`)
}

// writeBashCompletion writes the bash completion: the commands, each
// command's flags, and file names for the value of a flag that takes a
// path.
func writeBashCompletion(w io.Writer, docs []commandDoc) {
	var names []string
	for _, c := range docs {
		names = append(names, c.name)
	}
	fmt.Fprintf(w, `# bash completion for dnsstandby(8), made by dnsstandby gen-completion bash
# from the binary's own flags.
_dnsstandby() {
	local cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD-1]}
	COMPREPLY=()
	if ((COMP_CWORD == 1)); then
		COMPREPLY=($(compgen -W '%s' -- "$cur"))
		return
	fi
	# --name=VALUE: bash splits the word at "=".
	if [[ $prev == = ]] && ((COMP_CWORD > 2)); then
		prev=${COMP_WORDS[COMP_CWORD-2]}
	elif [[ $cur == = ]]; then
		cur=
	fi
	[[ $prev == --* ]] || prev=-$prev
	local flags= values= paths=
	case ${COMP_WORDS[1]} in
`, strings.Join(names, " "))
	for _, c := range docs {
		if len(c.flags) == 0 {
			continue
		}
		var flags, values, paths []string
		for _, f := range c.flags {
			flags = append(flags, "--"+f.name)
			if f.arg != "" {
				values = append(values, "--"+f.name)
			}
			if f.isPath() {
				paths = append(paths, "--"+f.name)
			}
		}
		fmt.Fprintf(w, "\t%s)\n\t\tflags='%s'\n\t\tvalues='%s'\n\t\tpaths='%s'\n\t\t;;\n",
			c.name, strings.Join(flags, " "), strings.Join(values, " "), strings.Join(paths, " "))
	}
	fmt.Fprint(w, `	esac
	# The value of a flag that takes one: a file name where it is a path,
	# else nothing to offer.
	if [[ " $values " == *" $prev "* ]]; then
		if [[ " $paths " == *" $prev "* ]]; then
			compopt -o filenames 2>/dev/null
			COMPREPLY=($(compgen -f -- "$cur"))
		fi
		return
	fi
	COMPREPLY=($(compgen -W "$flags" -- "$cur"))
}
complete -F _dnsstandby dnsstandby
`)
}

// genManCommand is the hidden `dnsstandby gen-man`: dnsstandby(8) on
// stdout.
func genManCommand(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		fmt.Fprintf(stderr, "dnsstandby gen-man: takes no arguments, got %q\n", args)
		return exitUsage
	}
	writeMan(stdout, commandDocs(), buildinfo.Read())
	return exitOK
}

// genCompletionCommand is the hidden `dnsstandby gen-completion bash`:
// the completion script on stdout.
func genCompletionCommand(args []string, stdout, stderr io.Writer) int {
	if len(args) != 1 || args[0] != "bash" {
		fmt.Fprintf(stderr, "dnsstandby gen-completion: want one shell, bash; got %q\n", args)
		return exitUsage
	}
	writeBashCompletion(stdout, commandDocs())
	return exitOK
}
