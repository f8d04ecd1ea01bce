package reports

import (
	"bytes"
	"math/rand/v2"
	"strings"
	"testing"
)

// repeatRuns makes n runs of one configuration: each run has its own conditions, a factor
// drawn around mean with a 5 % standard deviation that scales all its latencies (the
// run-to-run variance that requests within one run cannot show), on top of the request
// noise synthRecords draws.
func repeatRuns(rng *rand.Rand, n int, mean float64) []*Run {
	out := make([]*Run, n)
	for i := range out {
		f := mean * (1 + 0.05*rng.NormFloat64())
		out[i] = &Run{Name: "r", Records: synthRecords(60, 0, f, rng.Uint64())}
	}
	return out
}

// TestCompareRunsAA: identical configurations (3 runs a side) give "no change" on every
// statistic in at least 95 % of 200 comparisons, where the request bootstrap of one run per
// side calls a change in most of them.
func TestCompareRunsAA(t *testing.T) {
	rng := rand.New(rand.NewPCG(42, 1))
	const trials = 200
	quiet, oneRunQuiet := 0, 0
	for range trials {
		b, c := repeatRuns(rng, 3, 1), repeatRuns(rng, 3, 1)
		cmps, err := CompareRuns(b, c, CompareRunsOptions{})
		if err != nil {
			t.Fatal(err)
		}
		changed := false
		for _, x := range cmps {
			if !x.HasCI && x.Verdict != VerdictTooFewRuns {
				t.Fatalf("%s %s has neither an interval nor a count of runs needed: %+v", x.Tag, x.Stat, x)
			}
			changed = changed || x.Verdict == "better" || x.Verdict == "worse"
		}
		if !changed {
			quiet++
		}
		// The old way: one run a side, bootstrap over requests.
		one := Compare(b[0], c[0], CompareOptions{Iterations: 200})
		changed = false
		for _, x := range one {
			changed = changed || x.HasCI && (x.Lo > 1 || x.Hi < 1)
		}
		if !changed {
			oneRunQuiet++
		}
	}
	if float64(quiet) < 0.95*trials {
		t.Errorf("A/A: %d of %d comparisons said no change, want at least 95 %%", quiet, trials)
	}
	t.Logf("A/A no change: over runs %d/%d, request bootstrap of one run a side %d/%d", quiet, trials, oneRunQuiet, trials)
}

// TestCompareRunsFindsRealChange: a 30 % slowdown is called worse on latency, with an
// interval around 1.3, and throughput per user worse too.
func TestCompareRunsFindsRealChange(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 1))
	b, c := repeatRuns(rng, 4, 1), repeatRuns(rng, 4, 1.3)
	cmps, err := CompareRuns(b, c, CompareRunsOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ tag, stat, verdict string }{
		{TagRequestLatency, "avg", "worse"}, {TagTTFT, "p50", "worse"}, {TagOutputTPSPerUser, "avg", "worse"}, {TagRequestCount, "avg", "no change"},
	} {
		var got *RunComparison
		for i := range cmps {
			if cmps[i].Tag == tc.tag && cmps[i].Stat == tc.stat {
				got = &cmps[i]
			}
		}
		if got == nil || got.Verdict != tc.verdict {
			t.Errorf("%s %s: %+v, want %s", tc.tag, tc.stat, got, tc.verdict)
		}
	}
	var out bytes.Buffer
	p := PointComparison{Point: "concurrency=1", BaseRuns: []string{"base-rep1", "base-rep4"}, CandRuns: []string{"cand-rep1", "cand-rep4"}, OverRuns: true, Rows: cmps}
	WriteSweepComparison(&out, &SweepComparison{Points: []PointComparison{p}}, false)
	if s := out.String(); !strings.Contains(s, "base:      2 runs base-rep1 .. base-rep4") || !strings.Contains(s, "candidate: 2 runs cand-rep1") || !strings.Contains(s, "worse") {
		t.Errorf("table:\n%s", s)
	}
	if _, err := CompareRuns(b[:1], c, CompareRunsOptions{}); err == nil || !strings.Contains(err.Error(), "--repeat") {
		t.Errorf("one base run: %v, want an error pointing at --repeat", err)
	}
}
