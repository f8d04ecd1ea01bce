package reports

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"unicode/utf8"
)

// keyedRun is a run as qual profile records it: the sweep point, AIPerf's input_config with
// the CLI's flags under mq_config, the target and the server's flags. Its latencies are
// scale times synthRecords' draw.
func keyedRun(t *testing.T, seed uint64, scale float64, conc int, inputMean, bundleSHA string, serverArgs ...string) *Run {
	t.Helper()
	ic, err := json.Marshal(map[string]any{
		"endpoint": map[string]any{"model_names": []string{"qwen3"}, "type": "chat", "streaming": true, "url": "http://127.0.0.1:41234"},
		"loadgen":  map[string]any{"concurrency": conc, "request_count": 60},
		"input":    map[string]any{"random_seed": seed},
		"mq_config": map[string]string{"input-tokens-mean": inputMean, "input-tokens-stddev": "0", "output-tokens": "16",
			"requests": "60", "seed": "0", "out": "/tmp/x", "image-format": "png", "image-width-mean": "0"},
		"mq_point": map[string]any{"parameter": "concurrency", "value": conc},
	})
	if err != nil {
		t.Fatal(err)
	}
	args := append([]string{"/opt/bin/qual-server", "--bundle", "/tmp/b.mqb", "--model-name", "qwen3", "--host", "127.0.0.1",
		"--port", "41234", "--records", "/tmp/r.jsonl", "--startup-timeout", "1m0s"}, serverArgs...)
	env, _ := json.Marshal(map[string]any{"server_kind": "process", "server_args": args})
	return &Run{Name: "r", Records: synthRecords(60, 0, scale, seed), Sweep: &SweepPoint{Parameter: "concurrency", Value: float64(conc)},
		InputConfig: ic, Environment: env,
		Target: &Target{Server: "qual-server (process)", URL: "http://127.0.0.1:41234", Model: "qwen3", BundleDigest: bundleSHA}}
}

func side(runs ...*Run) CompareSide {
	s := CompareSide{Runs: runs}
	for i, r := range runs {
		s.Names = append(s.Names, fmt.Sprintf("run-c%v-%d", r.Sweep.Value, i))
	}
	return s
}

func TestRunKey(t *testing.T) {
	r := keyedRun(t, 1, 1, 4, "32", "abc", "--max-batch", "64", "--device=cuda")
	k := RunKey(r)
	for name, want := range map[string]string{"endpoint": "chat", "stream": "true", "load": "closed", "concurrency": "4",
		"input_tokens_mean": "32", "output_tokens": "16", "model": "qwen3", "bundle": "abc",
		"server_args": "--max-batch 64 --device=cuda"} {
		if got, ok := k.Get(name); !ok || got != want {
			t.Errorf("key field %s = %q (recorded %v), want %q; key: %s", name, got, ok, want, k)
		}
	}
	for _, name := range []string{"url", "requests", "seed", "image_format"} {
		if v, ok := k.Get(name); ok {
			t.Errorf("key holds %s=%q; a process launch's URL and the measurement settings are not configuration", name, v)
		}
	}
	// A run written by AIPerf (no summary.json): what its input_config says, nothing more.
	a := &Run{InputConfig: json.RawMessage(`{"endpoint":{"type":"chat","streaming":false,"model_names":["m"]},"loadgen":{"request_rate":8,"request_rate_mode":"poisson"}}`)}
	if got := RunKey(a).String(); got != "endpoint=chat stream=false load=open concurrency=none request_rate=8 arrival=poisson model=m" {
		t.Errorf("AIPerf run key: %s", got)
	}
}

// TestCompareSweepPointByPoint reproduces the old fault: two concurrency sweeps (1 and 4)
// given as folders were taken as two repeats of one configuration, pooled, and printed "no
// change" with an interval such as [0.000, 1.07e154]. Now each point is compared with its
// own, and every interval stays within what the runs show.
func TestCompareSweepPointByPoint(t *testing.T) {
	base := side(keyedRun(t, 1, 1, 1, "32", "abc"), keyedRun(t, 2, 4, 4, "32", "abc"))
	cand := side(keyedRun(t, 3, 5.2, 4, "32", "abc"), keyedRun(t, 4, 1.3, 1, "32", "abc"))
	sc, err := CompareSweep(base, cand, CompareSweepOptions{Iterations: 200})
	if err != nil {
		t.Fatal(err)
	}
	if len(sc.Points) != 2 || sc.Points[0].Point != "concurrency=1" || sc.Points[1].Point != "concurrency=4" || len(sc.Unpaired) != 0 {
		t.Fatalf("points %+v, unpaired %v; want concurrency=1 and 4 paired", sc.Points, sc.Unpaired)
	}
	for _, p := range sc.Points {
		if p.OverRuns || len(p.Rows) == 0 {
			t.Errorf("%s: one run a side must be compared within run, got over-runs %v with %d rows (%s)", p.Point, p.OverRuns, len(p.Rows), p.Note)
		}
		lat, ok := findRow(p.Rows, TagRequestLatency, "avg")
		if !ok || lat.Ratio < 1.2 || lat.Ratio > 1.4 || !lat.HasCI || lat.Lo < 1 || lat.Hi > 1.6 || !strings.HasPrefix(lat.Verdict, "worse") {
			t.Errorf("%s: request latency avg %+v, want ratio 1.3 inside a narrow interval, worse", p.Point, lat)
		}
	}
	var out bytes.Buffer
	if err := WriteSweepComparison(&out, sc, false); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out.String(), "e+") || strings.Contains(out.String(), "[0, ") {
		t.Errorf("an interval wider than the data:\n%s", out.String())
	}
	checkWidth(t, out.String())
}

func findRow(rows []RunComparison, tag, stat string) (RunComparison, bool) {
	for _, r := range rows {
		if r.Tag == tag && r.Stat == stat {
			return r, true
		}
	}
	return RunComparison{}, false
}

func checkWidth(t *testing.T, s string) {
	t.Helper()
	for _, l := range strings.Split(s, "\n") {
		if n := utf8.RuneCountInString(l); n > CompareWidth {
			t.Errorf("line of %d columns, want at most %d:\n%s", n, CompareWidth, l)
		}
	}
}

// TestCompareSweepRefusesPooling: runs of one load but two bundles on one side are not
// repeats; the error names the field and the way out.
func TestCompareSweepRefusesPooling(t *testing.T) {
	base := side(keyedRun(t, 1, 1, 4, "32", "abc"), keyedRun(t, 2, 1, 4, "32", "def"))
	cand := side(keyedRun(t, 3, 1, 4, "32", "abc"), keyedRun(t, 4, 1, 4, "32", "abc"))
	_, err := CompareSweep(base, cand, CompareSweepOptions{})
	if err == nil || !strings.Contains(err.Error(), "bundle abc vs def") || !strings.Contains(err.Error(), "--ignore bundle") {
		t.Errorf("pooling two bundles: %v, want an error naming the bundle and --ignore bundle", err)
	}
	base = side(keyedRun(t, 1, 1, 4, "32", "abc", "--max-batch", "16"), keyedRun(t, 2, 1, 4, "32", "abc", "--max-batch", "64"))
	if _, err := CompareSweep(base, cand, CompareSweepOptions{}); err == nil || !strings.Contains(err.Error(), "server_args --max-batch 16 vs --max-batch 64") {
		t.Errorf("pooling two server flags: %v", err)
	}
	// Between the sides a different bundle is what is compared: shown, not refused.
	sc, err := CompareSweep(side(keyedRun(t, 1, 1, 4, "32", "abc")), side(keyedRun(t, 2, 1, 4, "32", "def")), CompareSweepOptions{Iterations: 100})
	if err != nil || len(sc.Points) != 1 || len(sc.Points[0].Differs) != 1 || sc.Points[0].Differs[0].Field != "bundle" {
		t.Errorf("one bundle against another: %v %+v", err, sc)
	}
}

// TestCompareSweepRefusesOtherLoad: concurrency 1 against 4, or two input lengths, is not a
// comparison of one configuration unless asked for by --ignore.
func TestCompareSweepRefusesOtherLoad(t *testing.T) {
	_, err := CompareSweep(side(keyedRun(t, 1, 1, 1, "32", "abc")), side(keyedRun(t, 2, 1, 4, "16", "abc")), CompareSweepOptions{})
	if err == nil || !strings.Contains(err.Error(), "concurrency 1 vs 4") || !strings.Contains(err.Error(), "input_tokens_mean 32 vs 16") ||
		!strings.Contains(err.Error(), "--ignore concurrency,input_tokens_mean") {
		t.Errorf("concurrency 1 against 4: %v", err)
	}
	sc, err := CompareSweep(side(keyedRun(t, 1, 1, 1, "32", "abc")), side(keyedRun(t, 2, 1, 4, "32", "abc")),
		CompareSweepOptions{Iterations: 100, Ignore: []string{"concurrency"}})
	if err != nil || len(sc.Points) != 1 || len(sc.Points[0].Differs) != 1 || sc.Points[0].Differs[0].String() != "concurrency 1 vs 4" {
		t.Errorf("--ignore concurrency: %v %+v", err, sc)
	}
	// A sweep point on one side only is named, the others compared.
	sc, err = CompareSweep(side(keyedRun(t, 1, 1, 1, "32", "abc"), keyedRun(t, 2, 1, 8, "32", "abc")), side(keyedRun(t, 3, 1, 1, "32", "abc")), CompareSweepOptions{Iterations: 100})
	if err != nil || len(sc.Points) != 1 || len(sc.Unpaired) != 1 || !strings.Contains(sc.Unpaired[0], "base concurrency=8") {
		t.Errorf("a point without a partner: %v %+v", err, sc)
	}
}

// TestCompareSweepTooFewRuns: two noisy runs a side leave Welch's interval at one degree of
// freedom, far wider than the runs (the old table printed it, e.g. [0.000, 6.6e15]); it is
// not printed, and the verdict says how many runs a side would do.
func TestCompareSweepTooFewRuns(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 1))
	var b, c []*Run
	for i := range 2 {
		b = append(b, keyedRun(t, rng.Uint64(), 1+0.1*rng.NormFloat64(), 4, "32", "abc"))
		c = append(c, keyedRun(t, rng.Uint64(), 1.05+0.1*rng.NormFloat64(), 4, "32", "abc"))
		b[i].Name, c[i].Name = "b", "c"
	}
	sc, err := CompareSweep(side(b...), side(c...), CompareSweepOptions{})
	if err != nil || len(sc.Points) != 1 || !sc.Points[0].OverRuns {
		t.Fatalf("%v %+v", err, sc)
	}
	lat, _ := findRow(sc.Points[0].Rows, TagRequestLatency, "avg")
	if lat.Verdict != VerdictTooFewRuns || lat.HasCI || lat.RunsNeeded <= 2 {
		t.Errorf("request latency avg over 2 noisy runs a side: %+v, want too few runs, no interval, more than 2 runs needed", lat)
	}
	var out bytes.Buffer
	WriteSweepComparison(&out, sc, false)
	if !strings.Contains(out.String(), "runs/side") || strings.Contains(out.String(), "e+") {
		t.Errorf("table:\n%s", out.String())
	}
	checkWidth(t, out.String())
	var wide bytes.Buffer
	WriteSweepComparison(&wide, sc, true)
	if !strings.Contains(wide.String(), "key:") || !strings.Contains(wide.String(), "candidate runs") {
		t.Errorf("--wide shows neither the key nor each run's value:\n%s", wide.String())
	}
}

func TestFmtRatio(t *testing.T) {
	for v, want := range map[float64]string{0.9123: "0.912", 1.0: "1.00", 1.0749: "1.07", 12.34: "12.3", 123.4: "123", 0.01234: "0.0123", 1.07e154: "1.07e+154", 0: "0"} {
		if got := fmtRatio(v); got != want {
			t.Errorf("fmtRatio(%v) = %q, want %q", v, got, want)
		}
	}
}

// TestCompareRefusesOtherExtraBody: two runs made with different extra request bodies
// (--extra-body, --temperature) are different configurations, named by extra_body; the
// same body written two ways is one.
func TestCompareRefusesOtherExtraBody(t *testing.T) {
	withBody := func(seed uint64, body string) *Run {
		r := keyedRun(t, seed, 1, 4, "32", "abc")
		var ic map[string]any
		if err := json.Unmarshal(r.InputConfig, &ic); err != nil {
			t.Fatal(err)
		}
		ic["mq_config"].(map[string]any)["extra_body"] = body
		r.InputConfig, _ = json.Marshal(ic)
		return r
	}
	t0 := CanonicalExtraBody(map[string]any{"temperature": json.Number("0.0"), "top_p": 1})
	t0b := CanonicalExtraBody(map[string]any{"top_p": json.Number("1e0"), "temperature": 0})
	t1 := CanonicalExtraBody(map[string]any{"temperature": 1})
	if t0 != `{"temperature":0,"top_p":1}` || t0b != t0 || t1 == t0 || CanonicalExtraBody(nil) != "{}" {
		t.Fatalf("canonical bodies %s, %s, %s", t0, t0b, t1)
	}
	_, err := CompareSweep(side(withBody(1, t0)), side(withBody(2, t1)), CompareSweepOptions{})
	if err == nil || !strings.Contains(err.Error(), "extra_body") || !strings.Contains(err.Error(), "--ignore extra_body") {
		t.Errorf("temperature 0 against 1: %v, want a refusal naming extra_body", err)
	}
	// Two bodies on one side are two configurations, never repeats of one: the run with a
	// partner is compared, the other named as unpaired.
	sc, err := CompareSweep(side(withBody(1, t0), withBody(3, t1)), side(withBody(2, t0)), CompareSweepOptions{Iterations: 100})
	if err != nil || len(sc.Points) != 1 || len(sc.Points[0].BaseRuns) != 1 || len(sc.Unpaired) != 1 {
		t.Errorf("two bodies on one side: %v %+v", err, sc)
	}
	if _, err := CompareSweep(side(withBody(1, t0)), side(withBody(2, t0b)), CompareSweepOptions{Iterations: 100}); err != nil {
		t.Errorf("one body written two ways: %v", err)
	}
}

func TestKeyDiffShowsTheDifference(t *testing.T) {
	d := KeyDiff{Field: "extra_body", A: `{"seed":7,"temperature":0,"top_p":1}`, B: `{"seed":7,"temperature":1,"top_p":1}`}
	if got := d.String(); got != `extra_body …ture":0,"top_p":1} vs …ture":1,"top_p":1}` {
		t.Errorf("diff %q does not show where the bodies differ", got)
	}
	if got := (KeyDiff{Field: "concurrency", A: "1", B: "4"}).String(); got != "concurrency 1 vs 4" {
		t.Errorf("short diff %q", got)
	}
}
