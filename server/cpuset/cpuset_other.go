//go:build !linux

package cpuset

import "errors"

var errNotLinux = errors.New("CPU placement needs Linux (sched_setaffinity); leave the CPU flags unset here")

// Allowed is not available off Linux.
func Allowed() (Set, error) { return nil, errNotLinux }

// Pin is not available off Linux.
func Pin(s Set) error { return errNotLinux }

// ThreadCPUs is not available off Linux.
func ThreadCPUs(pid int) (map[int]string, error) { return nil, errNotLinux }
