//go:build linux

package cpuset

import (
	"fmt"
	"os"
	"strconv"

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

// Pin restricts every thread of process pid (0: this process) to the CPUs of s. Threads
// started later inherit the mask of the thread that starts them, so pinning a process early
// (before its engine starts its threads) pins all of them. A thread started while Pin runs, by
// a thread not yet pinned, is caught by another pass over the thread list: Pin returns once a
// pass finds no thread it has not pinned.
func Pin(pid int, s Set) error {
	if len(s) == 0 {
		return fmt.Errorf("pin process %d: empty CPU set", pid)
	}
	var m unix.CPUSet
	for _, c := range s {
		m.Set(c)
	}
	dir := "/proc/self/task"
	if pid != 0 {
		dir = "/proc/" + strconv.Itoa(pid) + "/task"
	}
	done := map[int]bool{}
	for pass := 0; pass < 100; pass++ {
		ents, err := os.ReadDir(dir)
		if err != nil {
			return fmt.Errorf("pin process %d to CPUs %s: list its threads: %w", pid, s, err)
		}
		fresh := false
		for _, e := range ents {
			tid, err := strconv.Atoi(e.Name())
			if err != nil || done[tid] {
				continue
			}
			fresh = true
			if err := unix.SchedSetaffinity(tid, &m); err != nil && err != unix.ESRCH { // ESRCH: the thread ended meanwhile
				return fmt.Errorf("pin thread %d of process %d to CPUs %s: %w", tid, pid, s, err)
			}
			done[tid] = true
		}
		if !fresh {
			return nil
		}
	}
	return fmt.Errorf("pin process %d to CPUs %s: it kept starting threads through 100 passes", pid, s)
}
