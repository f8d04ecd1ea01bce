package cpuset

import (
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestParse(t *testing.T) {
	for _, c := range []struct {
		in   string
		want Set
		str  string
	}{
		{"", nil, ""},
		{"0", Set{0}, "0"},
		{"0-3,7", Set{0, 1, 2, 3, 7}, "0-3,7"},
		{" 7, 1-2 ,2", Set{1, 2, 7}, "1-2,7"},
		{"4-4", Set{4}, "4"},
		{"0,2-4,5", Set{0, 2, 3, 4, 5}, "0,2-5"},
	} {
		got, err := Parse(c.in)
		if err != nil {
			t.Fatalf("Parse(%q): %v", c.in, err)
		}
		if !slices.Equal(got, c.want) || got.String() != c.str {
			t.Errorf("Parse(%q) = %v (%q), want %v (%q)", c.in, got, got.String(), c.want, c.str)
		}
	}
}

func TestParseErrorsNameTheElement(t *testing.T) {
	for in, want := range map[string]string{
		"a":      `"a" is not a CPU number`,
		"1,,2":   `"" is not a CPU number`,
		"3-1":    `"3-1" runs backwards`,
		"-1":     `"-1" is not a CPU number`,
		"1-":     `"1-" is not a CPU number`,
		"+2":     `"+2" is not a CPU number`,
		"0-9999": `CPU 9999 in "0-9999" is beyond`,
		"1-2-3":  `"1-2-3" is not a CPU number`,
	} {
		_, err := Parse(in)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Parse(%q) error %v, want one containing %q", in, err, want)
		}
	}
}

// FuzzParse: anything Parse accepts prints to a list that parses back to the same set.
func FuzzParse(f *testing.F) {
	for _, s := range []string{"0", "0-3,7", "1,2,3", "5-5,1", " 2 , 4-6", "a", "3-1", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		set, err := Parse(s)
		if err != nil {
			return
		}
		if !slices.IsSorted(set) || len(slices.Compact(slices.Clone(set))) != len(set) {
			t.Fatalf("Parse(%q) = %v: not sorted and distinct", s, set)
		}
		back, err := Parse(set.String())
		if err != nil || !slices.Equal(back, set) {
			t.Fatalf("Parse(%q) = %v prints %q, which parses to %v, %v", s, set, set.String(), back, err)
		}
	})
}

func TestWithinAndCheck(t *testing.T) {
	if !(Set{1, 3}).Within(Set{0, 1, 2, 3}) || (Set{1, 4}).Within(Set{0, 1, 2, 3}) {
		t.Fatal("Within")
	}
	if runtime.GOOS != "linux" {
		t.Skip("affinity is Linux-only")
	}
	allowed, err := Allowed()
	if err != nil || len(allowed) == 0 {
		t.Fatalf("Allowed() = %v, %v", allowed, err)
	}
	if err := allowed.Check("--frontend-cpus"); err != nil {
		t.Fatalf("the allowed set itself fails Check: %v", err)
	}
	err = Set{maxCPU}.Check("--frontend-cpus")
	if err == nil || !strings.Contains(err.Error(), "--frontend-cpus 8191: this process may only run on CPUs "+allowed.String()) {
		t.Fatalf("Check of an unavailable CPU: %v", err)
	}
}

// pinnable returns the CPUs this test process may use and restores them when the test ends;
// the test is skipped off Linux.
func pinnable(t *testing.T) Set {
	t.Helper()
	if runtime.GOOS != "linux" {
		t.Skip("affinity is Linux-only")
	}
	allowed, err := Allowed()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := Pin(allowed); err != nil {
			t.Errorf("restore: %v", err)
		}
	})
	return allowed
}

// checkAllThreads fails the test for every thread of this process whose CPU list, as the
// kernel reports it (ThreadCPUs), is not want, and when it finds no thread at all.
func checkAllThreads(t *testing.T, want Set) {
	t.Helper()
	threads, err := ThreadCPUs(0)
	if err != nil {
		t.Fatal(err)
	}
	if len(threads) == 0 {
		t.Fatal("ThreadCPUs found no thread of this process")
	}
	for tid, got := range threads {
		if got != want.String() {
			t.Errorf("thread %d may run on CPUs %s, want %s", tid, got, want)
		}
	}
}

// TestPin pins this test process to one CPU and reads the kernel's view of every thread back.
func TestPin(t *testing.T) {
	allowed := pinnable(t)
	checkAllThreads(t, allowed) // the reading itself: before Pin, every thread has the whole set
	one := Set{allowed[len(allowed)-1]}
	if err := Pin(one); err != nil {
		t.Fatal(err)
	}
	checkAllThreads(t, one)
	if err := Pin(nil); err == nil {
		t.Error("Pin to the empty set succeeded")
	}
}

// TestPinWhileThreadsStart pins this process while it keeps starting OS threads (goroutines
// that lock theirs): every thread alive afterwards must have the new mask, including those a
// not-yet-pinned thread started during Pin.
func TestPinWhileThreadsStart(t *testing.T) {
	allowed := pinnable(t)
	hold := make(chan struct{})
	stop := make(chan struct{})
	spawned := make(chan struct{})
	go func() {
		defer close(spawned)
		for i := 0; i < 200; i++ {
			select {
			case <-stop:
				return
			default:
			}
			go func() {
				runtime.LockOSThread() // this goroutine's thread exits with it, after hold closes
				<-hold
			}()
		}
	}()
	one := Set{allowed[0]}
	if err := Pin(one); err != nil {
		t.Fatal(err)
	}
	close(stop)
	<-spawned
	defer close(hold)
	time.Sleep(50 * time.Millisecond) // let the last goroutines lock their threads
	checkAllThreads(t, one)
}
