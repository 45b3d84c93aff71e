package main

import (
	"flag"
	"fmt"
	"strings"
)

// envPrefix: every flag may also come from DNSSTANDBY_<NAME>, the name
// upper-cased with dashes as underscores (--listen: DNSSTANDBY_LISTEN).
const envPrefix = "DNSSTANDBY_"

// envName is the variable a flag may be given in.
func envName(flagName string) string {
	return envPrefix + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// parseWithEnv parses args into fs, then sets each flag the command line
// did not give from its DNSSTANDBY_<NAME> variable, read with lookup
// (os.LookupEnv): the command line wins over the environment. Every
// command reads the environment this way, so that a shell with the
// daemon's environment talks to and audits what the daemon was given.
func parseWithEnv(fs *flag.FlagSet, args []string, lookup func(string) (string, bool)) error {
	if err := fs.Parse(args); err != nil {
		return err
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if given[f.Name] || err != nil {
			return
		}
		key := envName(f.Name)
		v, ok := lookup(key)
		if !ok {
			return
		}
		if serr := fs.Set(f.Name, v); serr != nil {
			err = fmt.Errorf("%s=%q: %w", key, v, serr)
		}
	})
	return err
}

// optsVariable is the unit's variable holding the command line
// (/etc/default/dnsstandby); it is not a setting of its own.
const optsVariable = envPrefix + "OPTS"

// checkEnv refuses a DNSSTANDBY_* variable in environ (os.Environ) that
// names no flag of fs: a misspelt setting would otherwise be ignored
// without a word. The variables Kubernetes sets for a Service named
// dnsstandby (DNSSTANDBY_SERVICE_HOST, DNSSTANDBY_PORT_9355_TCP, ...) are
// not settings and pass.
func checkEnv(fs *flag.FlagSet, environ []string) error {
	known := map[string]bool{optsVariable: true}
	fs.VisitAll(func(f *flag.Flag) { known[envName(f.Name)] = true })
	for _, kv := range environ {
		key, _, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(key, envPrefix) || known[key] || serviceLink(key) {
			continue
		}
		return fmt.Errorf("%s: no such setting", key)
	}
	return nil
}

// serviceLink reports whether key is one of the variables Kubernetes
// sets for a Service named dnsstandby.
func serviceLink(key string) bool {
	rest := strings.TrimPrefix(key, envPrefix)
	return strings.HasPrefix(rest, "SERVICE_") || rest == "PORT" || strings.HasPrefix(rest, "PORT_")
}
