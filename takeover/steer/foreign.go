package steer

import (
	"errors"
	"fmt"
	"os"

	"github.com/cilium/ebpf"
)

// programName is the name dnsstandby loads its steering programs under.
const programName = "dnsstandby_steer"

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
		if err != nil || info.Type != ebpf.SkReuseport || info.Name == programName {
			continue
		}
		out = append(out, fmt.Sprintf("id %d name %q", id, info.Name))
	}
}
