// Package cpuset parses Linux CPU lists ("0-3,7", the cpuset(7) and taskset syntax) and pins
// processes to them. qual-server places its HTTP frontend and its engine workers on CPUs of
// their own (--frontend-cpus, --worker-cpus): on a machine whose cores are all busy, a frontend
// that shares cores with the engine and the load generator waits for the kernel's scheduler
// before it can write a first token, which is most of the time-to-first-token tail of the
// frontend-cost benchmark on 2 cores (README "Benchmarks").
package cpuset

import (
	"fmt"
	"runtime"
	"sort"
	"strconv"
	"strings"

	"github.com/modelqual/modelqual/server/envconfig"
)

// Set is a sorted list of distinct CPU numbers.
type Set []int

// maxCPU bounds the CPU numbers Parse accepts (Linux's CONFIG_NR_CPUS is at most 8192).
const maxCPU = 8191

// Parse reads a CPU list: comma-separated CPU numbers and inclusive ranges ("0-3,7"). The
// empty string is the empty set. Errors name the element that is wrong.
func Parse(s string) (Set, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	seen := map[int]bool{}
	for _, part := range strings.Split(s, ",") {
		p := strings.TrimSpace(part)
		lo, hi, isRange := strings.Cut(p, "-")
		a, err := cpuNumber(lo, p)
		if err != nil {
			return nil, err
		}
		b := a
		if isRange {
			if b, err = cpuNumber(hi, p); err != nil {
				return nil, err
			}
			if b < a {
				return nil, fmt.Errorf("CPU range %q runs backwards; write it low-high", p)
			}
		}
		for c := a; c <= b; c++ {
			seen[c] = true
		}
	}
	out := make(Set, 0, len(seen))
	for c := range seen {
		out = append(out, c)
	}
	sort.Ints(out)
	return out, nil
}

func cpuNumber(s, elem string) (int, error) {
	s = strings.TrimSpace(s)
	n, err := strconv.Atoi(s)
	if err != nil || s[0] == '+' || s[0] == '-' { // Atoi takes a sign; a CPU number has none
		return 0, fmt.Errorf("%q is not a CPU number or range (write a list such as 0-3,7)", elem)
	}
	if n > maxCPU {
		return 0, fmt.Errorf("CPU %d in %q is beyond the largest CPU number Linux supports (%d)", n, elem, maxCPU)
	}
	return n, nil
}

// String is the canonical list form, as the kernel prints it in /proc/<pid>/status
// (Cpus_allowed_list): runs of consecutive CPUs as low-high ("0-3,7", "0-1").
func (s Set) String() string {
	var b strings.Builder
	for i := 0; i < len(s); {
		j := i
		for j+1 < len(s) && s[j+1] == s[j]+1 {
			j++
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		if j == i {
			b.WriteString(strconv.Itoa(s[i]))
		} else {
			fmt.Fprintf(&b, "%d-%d", s[i], s[j])
		}
		i = j + 1
	}
	return b.String()
}

// MatchGOMAXPROCS sets GOMAXPROCS to the size of s, the CPUs a process has just pinned itself
// to, unless the GOMAXPROCS environment variable chose it: Go sized it from the CPUs the
// process could use at start, and more Ps than CPUs make the runtime's threads take turns on
// the same CPU, which is the wait placement is there to remove. It returns the previous value.
func MatchGOMAXPROCS(s Set) int {
	prev := runtime.GOMAXPROCS(0)
	if !envconfig.GOMAXPROCS.IsSet() && len(s) > 0 {
		runtime.GOMAXPROCS(len(s))
	}
	return prev
}

// Within reports whether every CPU of s is in all.
func (s Set) Within(all Set) bool {
	in := map[int]bool{}
	for _, c := range all {
		in[c] = true
	}
	for _, c := range s {
		if !in[c] {
			return false
		}
	}
	return true
}

// Check returns an error naming flag when s has CPUs this process may not run on.
func (s Set) Check(flag string) error {
	allowed, err := Allowed()
	if err != nil {
		return fmt.Errorf("%s %s: %w", flag, s, err)
	}
	if !s.Within(allowed) {
		return fmt.Errorf("%s %s: this process may only run on CPUs %s; pass CPUs from that list", flag, s, allowed)
	}
	return nil
}
