//go:build linux

package cpuset

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Allowed is the set of CPUs the calling thread may run on (its affinity mask).
func Allowed() (Set, error) {
	var m unix.CPUSet
	if err := unix.SchedGetaffinity(0, &m); err != nil {
		return nil, fmt.Errorf("read CPU affinity: %w", err)
	}
	return fromMask(&m), nil
}

func fromMask(m *unix.CPUSet) Set {
	var s Set
	for c := 0; c <= maxCPU && len(s) < m.Count(); c++ {
		if m.IsSet(c) {
			s = append(s, c)
		}
	}
	return s
}

// Pin restricts every thread of this process to the CPUs of s. Threads started later inherit
// the mask of the thread that starts them, so pinning a process early (before its engine starts
// its threads) pins all of them. A thread started while Pin runs, by a thread not yet pinned, is
// caught by another pass over the thread list: Pin returns once a pass finds no thread it has
// not pinned.
func Pin(s Set) error {
	if len(s) == 0 {
		return fmt.Errorf("pin to CPUs: empty CPU set")
	}
	var m unix.CPUSet
	for _, c := range s {
		m.Set(c)
	}
	done := map[int]bool{}
	for pass := 0; pass < 100; pass++ {
		ents, err := os.ReadDir("/proc/self/task")
		if err != nil {
			return fmt.Errorf("pin to CPUs %s: list this process's threads: %w", s, err)
		}
		fresh := false
		for _, e := range ents {
			tid, err := strconv.Atoi(e.Name())
			if err != nil || done[tid] {
				continue
			}
			fresh = true
			if err := unix.SchedSetaffinity(tid, &m); err != nil && err != unix.ESRCH { // ESRCH: the thread ended meanwhile
				return fmt.Errorf("pin thread %d to CPUs %s: %w", tid, s, err)
			}
			done[tid] = true
		}
		if !fresh {
			return nil
		}
	}
	return fmt.Errorf("pin to CPUs %s: this process kept starting threads through 100 passes", s)
}

// ThreadCPUs is the CPU list of every live thread of process pid (0: this process) as the
// kernel reports it (Cpus_allowed_list in /proc/<pid>/task/<tid>/status), keyed by thread id:
// a reading of a placement that does not go through Pin, for checking one.
func ThreadCPUs(pid int) (map[int]string, error) {
	dir := "/proc/self/task"
	if pid != 0 {
		dir = "/proc/" + strconv.Itoa(pid) + "/task"
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("list the threads of process %d: %w", pid, err)
	}
	out := map[int]string{}
	for _, e := range ents {
		tid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(dir + "/" + e.Name() + "/status")
		if err != nil {
			continue // the thread ended
		}
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "Cpus_allowed_list:"); ok {
				out[tid] = strings.TrimSpace(v)
			}
		}
	}
	return out, nil
}
