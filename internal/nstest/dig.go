package nstest

import (
	"fmt"
	"regexp"
	"strings"
	"testing"

	"github.com/miekg/dns"
)

// digFlags make dig print only what ParseDig reads: the header comment with
// the status, and the answer section. One try of five seconds: an answer
// takes microseconds here, but CI machines run loaded.
func digFlags() []string {
	return []string{"+noall", "+comments", "+answer", "+tries=1", "+time=5"}
}

var digStatus = regexp.MustCompile(`->>HEADER<<- opcode: \w+, status: (\w+),`)

// ParseDig reads the output of `dig +noall +comments +answer` into the reply's rcode and
// answer records.
func ParseDig(out string) (rcode int, answer []dns.RR, err error) {
	rcode = -1
	for line := range strings.Lines(out) {
		line = strings.TrimSpace(line)
		if m := digStatus.FindStringSubmatch(line); m != nil {
			code, ok := dns.StringToRcode[m[1]]
			if !ok {
				return 0, nil, fmt.Errorf("dig status %q: unknown rcode", m[1])
			}
			rcode = code
			continue
		}
		if line == "" || strings.HasPrefix(line, ";") {
			continue
		}
		rr, err := dns.NewRR(line)
		if err != nil {
			return 0, nil, fmt.Errorf("dig answer line %q: %w", line, err)
		}
		answer = append(answer, rr)
	}
	if rcode < 0 {
		return 0, nil, fmt.Errorf("no status line in dig output:\n%s", out)
	}
	return rcode, answer, nil
}

// Dig runs `dig +noall +comments +answer +tries=1 +time=5 ARGS...` in ns and
// returns the reply's rcode and answer; it fails the test if dig fails.
func Dig(t testing.TB, ns *Namespace, args ...string) (rcode int, answer []dns.RR) {
	t.Helper()
	out := Run(t, ns, "dig", append(digFlags(), args...)...)
	rcode, answer, err := ParseDig(out)
	if err != nil {
		t.Fatalf("dig %s: %v", strings.Join(args, " "), err)
	}
	return rcode, answer
}
