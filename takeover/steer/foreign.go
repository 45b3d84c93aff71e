package steer

import (
	"errors"
	"fmt"
	"os"

	"github.com/cilium/ebpf"
)

// The names dnsstandby loads its steering program and a group's maps
// under. The kernel keeps at most 15 bytes of a name (BPF_OBJ_NAME_LEN
// less the NUL): programName is listed as "dnsstandby_stee".
const (
	programName   = "dnsstandby_steer"
	sockarrayName = "dnsstandby_sk"
	configName    = "dnsstandby_cfg"
	liveName      = "dnsstandby_live"
)

// kernelName is name as the kernel stores and lists it.
func kernelName(name string) string {
	const max = 15 // BPF_OBJ_NAME_LEN - 1
	if len(name) > max {
		return name[:max]
	}
	return name
}

// foreignPrograms lists the sk_reuseport programs loaded on the node that
// are not dnsstandby's, as "id N name X". Attaching ours to a group
// replaces whatever program the group had, and the kernel lets no socket
// read its group's program nor says which group holds one: what can be
// done is to report, before attaching, that another steerer is loaded.
// Listing needs CAP_SYS_ADMIN; without it the error says so.
func foreignPrograms() ([]string, error) {
	var out []string
	var id ebpf.ProgramID
	for {
		next, err := ebpf.ProgramGetNextID(id)
		if errors.Is(err, os.ErrNotExist) {
			return out, nil
		}
		if err != nil {
			return out, fmt.Errorf("list BPF programs: %w", err)
		}
		id = next
		p, err := ebpf.NewProgramFromID(id)
		if err != nil {
			continue // unloaded meanwhile
		}
		info, err := p.Info()
		p.Close()
		if err != nil || info.Type != ebpf.SkReuseport || ours(info) {
			continue
		}
		out = append(out, fmt.Sprintf("id %d name %q", id, info.Name))
	}
}

// ours reports whether a loaded sk_reuseport program is one a dnsstandby
// loaded: this process's, or a predecessor's, which stays attached across
// a restart by design (Leave) until the successor replaces it. It is ours
// when it has our program's name and uses a group's maps: a
// REUSEPORT_SOCKARRAY named sockarrayName and an ARRAY named configName.
// The name alone is what any program may call itself; the maps are what
// makes it steer as ours does. Not the program's tag: that changes with
// every change to Program, so an upgrade in place (dpkg -i) would call
// the predecessor's program foreign.
func ours(info *ebpf.ProgramInfo) bool {
	if info.Name != kernelName(programName) {
		return false
	}
	ids, ok := info.MapIDs()
	if !ok {
		return false
	}
	var sockarray, config bool
	for _, id := range ids {
		m, err := ebpf.NewMapFromID(id)
		if err != nil {
			return false
		}
		mi, err := m.Info()
		m.Close()
		if err != nil {
			return false
		}
		switch {
		case mi.Type == ebpf.ReusePortSockArray && mi.Name == kernelName(sockarrayName):
			sockarray = true
		case mi.Type == ebpf.Array && mi.Name == kernelName(configName):
			config = true
		}
	}
	return sockarray && config
}
