package server_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/modelqual/modelqual/server/cpuset"
)

// checkThreads fails the test for every thread of process pid whose CPU list, as the kernel
// reports it, is not want, and when it finds none.
func checkThreads(t *testing.T, who string, pid int, want string) {
	t.Helper()
	threads, err := cpuset.ThreadCPUs(pid)
	if err != nil || len(threads) == 0 {
		t.Fatalf("%s pid %d: threads %v, %v", who, pid, threads, err)
	}
	for tid, got := range threads {
		if got != want {
			t.Errorf("%s pid %d thread %d may run on CPUs %s, want %s", who, pid, tid, got, want)
		}
	}
}

// allowedCPUs is the CPUs this test may use; the test is skipped off Linux.
func allowedCPUs(t *testing.T) cpuset.Set {
	t.Helper()
	if runtime.GOOS != "linux" {
		t.Skip("CPU placement is Linux-only")
	}
	all, err := cpuset.Allowed()
	if err != nil {
		t.Fatal(err)
	}
	return all
}

// TestCPUPlacement: --frontend-cpus and --worker-cpus pin every thread of the frontend and of
// each worker (engine threads included), and the server serves while placed.
func TestCPUPlacement(t *testing.T) {
	all := allowedCPUs(t)
	fe, wk := cpuset.Set{all[len(all)-1]}, cpuset.Set{all[0]}
	s := startServer(t, qwenBundle(t), "--frontend-cpus", fe.String(), "--worker-cpus", wk.String(), "--threads", "0")
	if code, _, body := s.post("/v1/completions", `{"model":"test-model","prompt":"Hello","max_tokens":4}`); code != 200 {
		t.Fatalf("completion while placed: %d %s", code, body)
	}
	for _, c := range []struct {
		who  string
		pids []int
		want string
	}{{"frontend", []int{s.cmd.Process.Pid}, fe.String()}, {"worker", s.workerPIDs(t), wk.String()}} {
		if len(c.pids) == 0 {
			t.Fatalf("no %s pid", c.who)
		}
		for _, pid := range c.pids {
			checkThreads(t, c.who, pid, c.want)
		}
	}
	if !strings.Contains(s.log.String(), "frontend on CPUs "+fe.String()+", workers on CPUs "+wk.String()) {
		t.Errorf("the log does not say where the processes run:\n%s", s.log.String())
	}
}

// TestCPUPlacementFrontendOnly: a worker does not inherit the frontend's CPUs.
func TestCPUPlacementFrontendOnly(t *testing.T) {
	all := allowedCPUs(t)
	if len(all) < 2 {
		t.Skip("needs two CPUs")
	}
	s := startServer(t, mockBundle(t, 0), "--frontend-cpus", strconv.Itoa(all[0]))
	pids := s.workerPIDs(t)
	if len(pids) == 0 {
		t.Fatal("no worker pid")
	}
	for _, pid := range pids {
		checkThreads(t, "worker", pid, all.String())
	}
}

// TestCPUPlacementBadInput: a malformed or unavailable CPU list stops the server at start with
// a message naming the flag and what to do.
func TestCPUPlacementBadInput(t *testing.T) {
	bundle := mockBundle(t, 0)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--frontend-cpus", "1-x"}, `--frontend-cpus: "1-x" is not a CPU number or range (write a list such as 0-3,7)`},
		{[]string{"--worker-cpus", "3-1"}, `--worker-cpus: CPU range "3-1" runs backwards`},
		{[]string{"--frontend-cpus", "8000"}, "--frontend-cpus 8000: this process may only run on CPUs"},
		{[]string{"--worker-cpus", "0,8000"}, "pass CPUs from that list"},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		args := append([]string{"--bundle", bundle, "--model-name", "m", "--port", strconv.Itoa(freePort(t))}, c.args...)
		out, err := exec.CommandContext(ctx, serverBin, args...).CombinedOutput()
		cancel()
		ee, ok := err.(*exec.ExitError)
		if !ok || ee.ExitCode() != 2 {
			t.Errorf("%v: exit %v, want status 2\n%s", c.args, err, out)
		}
		if !strings.Contains(string(out), c.want) {
			t.Errorf("%v: output lacks %q:\n%s", c.args, c.want, out)
		}
	}
}

// TestWorkerPipesPolled: a worker reads and writes its protocol pipes in non-blocking mode,
// through Go's poller. With the blocking descriptors os/exec hands a child, every read was a
// blocking system call holding the worker's one P (GOMAXPROCS follows its CPUs), and the step
// loop waited 100-200 us for sysmon to take it back before it saw a new request.
func TestWorkerPipesPolled(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("reads /proc")
	}
	s := startServer(t, mockBundle(t, 0))
	pids := s.workerPIDs(t)
	if len(pids) == 0 {
		t.Fatal("no worker pid")
	}
	const oNonblock = 0o4000
	for _, pid := range pids {
		for _, fd := range []int{3, 4} {
			b, err := os.ReadFile(fmt.Sprintf("/proc/%d/fdinfo/%d", pid, fd))
			if err != nil {
				t.Fatal(err)
			}
			var flags int64 = -1
			for _, l := range strings.Split(string(b), "\n") {
				if v, ok := strings.CutPrefix(l, "flags:"); ok {
					flags, _ = strconv.ParseInt(strings.TrimSpace(v), 8, 64)
				}
			}
			if flags < 0 || flags&oNonblock == 0 {
				t.Errorf("worker %d fd %d: flags %#o, want O_NONBLOCK set", pid, fd, flags)
			}
		}
	}
}

// TestWorkerModeByHand: `qual-server worker` without the frontend's pipes on fds 3 and 4 says
// what it needs and exits 2, before it opens any bundle.
func TestWorkerModeByHand(t *testing.T) {
	out, err := exec.Command(serverBin, "worker", "--bundle", mockBundle(t, 0)).CombinedOutput()
	ee, ok := err.(*exec.ExitError)
	if !ok || ee.ExitCode() != 2 || !strings.Contains(string(out), "worker mode needs the protocol pipes on fds 3 and 4") {
		t.Fatalf("exit %v, output:\n%s", err, out)
	}
}
