package recount

import (
	"bytes"
	"encoding/json"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// The runs under testdata were written by ./bin/qual profile against qual-server (summary.json
// without its provenance and environment, which are not figures): a completions stream with
// cancellations and a goodput SLO, an open-loop chat stream, a vision chat stream where half
// the requests carry an image, and an image profile of zimage-tiny.

func TestPercentileIsNumpysLinear(t *testing.T) {
	// METRICS.md's worked example.
	x := []float64{100, 110, 120, 130, 140, 150, 160, 180, 200, 400}
	var s []sample
	for i := len(x) - 1; i >= 0; i-- { // unsorted on purpose
		s = append(s, sample{x[i], "r" + strconv.Itoa(i)})
	}
	d, ok := describe(s)
	if !ok {
		t.Fatal("describe: empty")
	}
	for p, want := range map[int]float64{50: 145, 90: 220, 95: 310, 99: 382, 1: 100.9, 25: 122.5} {
		if got := d.pct[p]; !agree(got, want, 400) {
			t.Errorf("p%d = %v, want %v", p, got, want)
		}
	}
	if d.avg != 169 || d.lo != 100 || d.hi != 400 || d.n != 10 {
		t.Errorf("avg %v min %v max %v n %d, want 169 100 400 10", d.avg, d.lo, d.hi, d.n)
	}
	// Population standard deviation (np.std, Python's statistics.pstdev): sqrt(Σ(x−169)²/10).
	if want := 82.39538822045807; !agree(d.std, want, 0) {
		t.Errorf("std = %v, want %v", d.std, want)
	}
	if got := d.statRecords("p99"); strings.Join(got, ",") != "r8,r9" {
		t.Errorf("p99 rests on %v, want r8,r9 (the two values it interpolates between)", got)
	}
}

func TestVerifyAgreesOnRunsOfQualProfile(t *testing.T) {
	for _, name := range []string{"stream-cancel", "chat-rate", "vision", "images"} {
		rep, err := Verify(filepath.Join("testdata", name))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if err := rep.Err(); err != nil {
			t.Errorf("%s: %v", name, err)
		}
		if rep.Checked < 50 {
			t.Errorf("%s: only %d figures compared", name, rep.Checked)
		}
	}
}

// copyRun copies a testdata run into a temporary folder a test may edit.
func copyRun(t *testing.T, name string) string {
	t.Helper()
	dir := t.TempDir()
	ents, err := os.ReadDir(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join("testdata", name, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, e.Name()), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// editJSON rewrites one JSON file through edit, numbers kept exactly as written.
func editJSON(t *testing.T, path string, edit func(v map[string]any)) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v map[string]any
	if err := dec.Decode(&v); err != nil {
		t.Fatal(err)
	}
	edit(v)
	out, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, out, 0o644); err != nil {
		t.Fatal(err)
	}
}

// editLine rewrites the JSONL line whose text contains key through edit.
func editLine(t *testing.T, path, key string, edit func(v map[string]any)) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	found := false
	for i, l := range lines {
		if !strings.Contains(l, key) || found {
			continue
		}
		found = true
		dec := json.NewDecoder(strings.NewReader(l))
		dec.UseNumber()
		var v map[string]any
		if err := dec.Decode(&v); err != nil {
			t.Fatal(err)
		}
		edit(v)
		out, _ := json.Marshal(v)
		lines[i] = string(out)
	}
	if !found {
		t.Fatalf("no line of %s holds %q", path, key)
	}
	if err := os.WriteFile(path, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
}

// scale multiplies a json.Number by f.
func scale(v any, f float64) json.Number {
	x, _ := v.(json.Number).Float64()
	return json.Number(strconv.FormatFloat(x*f, 'g', -1, 64))
}

// mustFail verifies dir and returns the mismatch report, failing the test when everything
// agreed.
func mustFail(t *testing.T, dir string) string {
	t.Helper()
	rep, err := Verify(dir)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Err() == nil {
		t.Fatal("the edited run verified clean")
	}
	return rep.Err().Error()
}

func wantAll(t *testing.T, msg string, parts ...string) {
	t.Helper()
	for _, p := range parts {
		if !strings.Contains(msg, p) {
			t.Errorf("the report does not say %q:\n%s", p, msg)
		}
	}
}

func TestVerifyNamesAHandEditedSummaryFigure(t *testing.T) {
	dir := copyRun(t, "stream-cancel")
	var was json.Number
	editJSON(t, filepath.Join(dir, summaryFile), func(v map[string]any) {
		m := v["profiling"].(map[string]any)["metrics"].(map[string]any)["time_to_first_token"].(map[string]any)
		was = m["p99"].(json.Number)
		m["p99"] = scale(was, 1.001)
	})
	msg := mustFail(t, dir)
	wantAll(t, msg, "summary.json profiling time_to_first_token.p99: reported "+string(scale(was, 1.001))+", the records give "+string(was),
		"the statistic itself is miscomputed", "records: 8966d7af-")
	if strings.Count(msg, "\n") != 1 {
		t.Errorf("one edit, want exactly one mismatch:\n%s", msg)
	}

	dir = copyRun(t, "stream-cancel")
	editJSON(t, filepath.Join(dir, summaryFile), func(v map[string]any) {
		m := v["profiling"].(map[string]any)["metrics"].(map[string]any)["request_throughput"].(map[string]any)
		m["avg"] = scale(m["avg"], 1.25)
	})
	wantAll(t, mustFail(t, dir), "summary.json profiling request_throughput: reported", "benchmark window")
}

func TestVerifyNamesTheRecordWhoseExportDiffers(t *testing.T) {
	dir := copyRun(t, "vision")
	// TTFT over the wrong span for one request: its exported value and every statistic over
	// it disagree with the client's chunk times.
	editLine(t, filepath.Join(dir, exportJSONLFile), `"x_request_id":"ff2eca7d-3"`, func(v map[string]any) {
		m := v["metrics"].(map[string]any)["time_to_first_token"].(map[string]any)
		m["value"] = scale(m["value"], 2)
	})
	wantAll(t, mustFail(t, dir), "profile_export.jsonl ff2eca7d-3 time_to_first_token: reported", "records: ff2eca7d-3")
}

func TestVerifyKeepsWarmupAndFailuresWhereTheDefinitionsPutThem(t *testing.T) {
	// A warmup request counted as measured.
	dir := copyRun(t, "stream-cancel")
	editJSON(t, filepath.Join(dir, summaryFile), func(v map[string]any) {
		p := v["profiling"].(map[string]any)
		p["requests"] = json.Number(strconv.Itoa(mustInt(t, p["requests"]) + 1))
	})
	wantAll(t, mustFail(t, dir), "summary.json profiling requests: reported 13, the records give 12")

	// The cancelled request's latency averaged in: its export line loses its error.
	dir = copyRun(t, "stream-cancel")
	editLine(t, filepath.Join(dir, exportJSONLFile), `"error":{`, func(v map[string]any) { v["error"] = nil })
	wantAll(t, mustFail(t, dir), "profile_export.jsonl", " error: reported false, the records give true")
}

func mustInt(t *testing.T, v any) int {
	t.Helper()
	i, err := v.(json.Number).Int64()
	if err != nil {
		t.Fatal(err)
	}
	return int(i)
}

func TestVerifyChecksTheCSVToItsDecimals(t *testing.T) {
	dir := copyRun(t, "chat-rate")
	path := filepath.Join(dir, aiperfCSVFile)
	b, _ := os.ReadFile(path)
	lines := strings.Split(string(b), "\n")
	for i, l := range lines {
		if strings.HasPrefix(l, "Request Throughput (requests/sec),") {
			f := strings.Split(l, ",")
			x, _ := strconv.ParseFloat(f[1], 64)
			lines[i] = f[0] + "," + strconv.FormatFloat(x+0.01, 'f', 2, 64)
		}
	}
	if err := os.WriteFile(path, []byte(strings.Join(lines, "\n")), 0o644); err != nil {
		t.Fatal(err)
	}
	wantAll(t, mustFail(t, dir), "profile_export_aiperf.csv request_throughput: reported")
}

func TestVerifyChecksServerRecordsAgainstResponses(t *testing.T) {
	dir := copyRun(t, "chat-rate")
	editLine(t, filepath.Join(dir, serverRecordsFile), `"request_id":"5b5ba060-5"`, func(v map[string]any) {
		v["output_tokens"] = json.Number(strconv.Itoa(mustInt(t, v["output_tokens"]) + 1))
	})
	wantAll(t, mustFail(t, dir), "server_records.jsonl 5b5ba060-5 output_tokens (usage.completion_tokens): the server's record says 17, the client received 16")

	// A request with no record, and one with two.
	dir = copyRun(t, "chat-rate")
	path := filepath.Join(dir, serverRecordsFile)
	b, _ := os.ReadFile(path)
	var kept []string
	for _, l := range strings.Split(strings.TrimRight(string(b), "\n"), "\n") {
		switch {
		case strings.Contains(l, `"request_id":"5b5ba060-7"`):
		case strings.Contains(l, `"request_id":"5b5ba060-8"`):
			kept = append(kept, l, l)
		default:
			kept = append(kept, l)
		}
	}
	os.WriteFile(path, []byte(strings.Join(kept, "\n")+"\n"), 0o644)
	wantAll(t, mustFail(t, dir), "1 requests sent without a server record: reported no record, the records give one record each; records: 5b5ba060-7",
		"1 requests with several server records", "records: 5b5ba060-8")
}

func TestVerifyImages(t *testing.T) {
	dir := copyRun(t, "images")
	editJSON(t, filepath.Join(dir, summaryFile), func(v map[string]any) {
		p := v["points"].([]any)[0].(map[string]any)
		d := p["http_latency_ms"].(map[string]any)
		d["P99"] = scale(d["P99"], 0.9)
		p["images_per_second"] = scale(p["images_per_second"], 1.1)
	})
	wantAll(t, mustFail(t, dir), "summary.json img-c1 http_latency_ms.p99: reported", "summary.json img-c1 images_per_second: reported")

	dir = copyRun(t, "images")
	editLine(t, filepath.Join(dir, serverRecordsFile), `"request_id":"img-c1-m-2"`, func(v map[string]any) {
		v["image"].(map[string]any)["png_bytes"] = json.Number("1")
	})
	wantAll(t, mustFail(t, dir), "server_records.jsonl img-c1-m-2 image.png_bytes: the server's record says 1, the client received 15531")
}

// TestRecountStandsApart: the recomputation imports the standard library only, never the
// code whose figures it checks (qual/metrics, reports, qual/load) nor a shared helper.
func TestRecountStandsApart(t *testing.T) {
	pkgs, err := parser.ParseDir(token.NewFileSet(), ".", func(fi os.FileInfo) bool { return !strings.HasSuffix(fi.Name(), "_test.go") }, parser.ImportsOnly)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pkgs {
		for name, f := range p.Files {
			for _, imp := range f.Imports {
				path, _ := strconv.Unquote(imp.Path.Value)
				if first, _, _ := strings.Cut(path, "/"); strings.Contains(first, ".") {
					t.Errorf("%s imports %s: qual/recount must stand apart from what it checks (standard library only)", name, path)
				}
			}
		}
	}
}

// TestVerifyHoldsWholeNumbersExactly: a report that writes a timestamp as an integer literal
// is held to the exact nanosecond (or to the float64 nearest it, which a float64 report
// writes), not to float64's 256 ns at 1.8e18.
func TestVerifyHoldsWholeNumbersExactly(t *testing.T) {
	client, err := readJSONL[clientRecord](filepath.Join("testdata", "stream-cancel", clientRecordsFile))
	if err != nil {
		t.Fatal(err)
	}
	var reqs []request
	for i := range client {
		reqs = append(reqs, recompute(&client[i], nil, false, false))
	}
	exact := aggregate(reqs, phaseProfiling, nil, nil).wholes[tagMinStart]
	for _, c := range []struct {
		lit  string
		pass bool
	}{
		{strconv.FormatInt(exact, 10), true},
		{strconv.FormatInt(int64(float64(exact)), 10), true},
		{strconv.FormatInt(exact+1, 10), exact+1 == int64(float64(exact))},
		{strconv.FormatInt(exact+300, 10), false},
	} {
		dir := copyRun(t, "stream-cancel")
		path := filepath.Join(dir, summaryFile)
		b, _ := os.ReadFile(path)
		s := string(b)
		i := strings.Index(s, `"min_request_timestamp": {`)
		j := strings.Index(s[i:], `"avg": `) + i + len(`"avg": `)
		k := strings.IndexAny(s[j:], ",\n}") + j
		if err := os.WriteFile(path, []byte(s[:j]+c.lit+s[k:]), 0o644); err != nil {
			t.Fatal(err)
		}
		rep, err := Verify(dir)
		if err != nil {
			t.Fatal(err)
		}
		if got := rep.Err() == nil; got != c.pass {
			t.Errorf("min_request_timestamp %s (exact %d): passes %v, want %v: %v", c.lit, exact, got, c.pass, rep.Err())
		}
	}
}

// TestVerifyImagesInTheTextLayout: an image run written per point in the text layout (a
// zimage-tiny premerge load profile, testdata/images-textlayout, its client records in the
// text records' format) agrees on every figure; a hand-edited request count and a server
// record whose output bytes differ from the PNG received are each named.
func TestVerifyImagesInTheTextLayout(t *testing.T) {
	dir := copyRun(t, "images-textlayout")
	r, err := Verify(dir)
	if err != nil || r.Err() != nil || r.Layout != "text (images)" {
		t.Fatalf("Verify(unedited run) = layout %q, %v, %v; want the text (images) layout, all agreeing", r.Layout, err, r.Err())
	}
	// Six measured and one warmup request: every statistic of eleven per-request metrics in
	// three reports and the export's lines is a check, several hundred in all.
	if r.Checked < 500 {
		t.Errorf("Verify checked %d figures; the image figures are not all recomputed", r.Checked)
	}
	editJSON(t, filepath.Join(dir, summaryFile), func(v map[string]any) {
		v["profiling"].(map[string]any)["requests"] = json.Number("7")
	})
	editLine(t, filepath.Join(dir, serverRecordsFile), `"request_id":"images-closed-c1-m-1"`, func(v map[string]any) {
		v["output_bytes"] = json.Number("1")
	})
	wantAll(t, mustFail(t, dir), "summary.json profiling requests: reported 7, the records give 6",
		"server_records.jsonl images-closed-c1-m-1 output_bytes: the server's record says 1")
}

// TestVerifyImageFigures: each image figure edited by hand in one report is named with both
// values: image throughput's p50 in summary.json, the PNG bytes' mean in the AIPerf JSON, the
// request throughput in the CSV, one request's image latency in profile_export.jsonl; and a
// client record whose receive time moved makes every report disagree with it.
func TestVerifyImageFigures(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(dir string)
		want []string
	}{
		{"summary image throughput", func(dir string) {
			editJSON(t, filepath.Join(dir, summaryFile), func(v map[string]any) {
				v["profiling"].(map[string]any)["metrics"].(map[string]any)["image_throughput"].(map[string]any)["p50"] = json.Number("24.5")
			})
		}, []string{"summary.json profiling image_throughput.p50: reported 24.5, the records give 23.36615584"}},
		{"aiperf png bytes", func(dir string) {
			editJSON(t, filepath.Join(dir, aiperfJSONFile), func(v map[string]any) {
				v["mq_png_bytes"].(map[string]any)["avg"] = json.Number("13000")
			})
		}, []string{"profile_export_aiperf.json mq_png_bytes.avg: reported 13000, the records give 12988.1666"}},
		{"export image latency", func(dir string) {
			editLine(t, filepath.Join(dir, exportJSONLFile), `"x_request_id":"images-closed-c1-m-0"`, func(v map[string]any) {
				v["metrics"].(map[string]any)["image_latency"].(map[string]any)["value"] = json.Number("60")
			})
		}, []string{"profile_export.jsonl images-closed-c1-m-0 image_latency: reported 60", "59.160752"}},
		{"client receive time", func(dir string) {
			editLine(t, filepath.Join(dir, clientRecordsFile), `"request_id":"images-closed-c1-m-0"`, func(v map[string]any) {
				v["end_ns"] = json.Number("69160752")
			})
		}, []string{"profile_export.jsonl images-closed-c1-m-0 request_latency: reported 59.160752, the records give 69.160752",
			"summary.json profiling request_latency", "profile_export_aiperf.json image_throughput"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := copyRun(t, "images-textlayout")
			tc.edit(dir)
			wantAll(t, mustFail(t, dir), tc.want...)
		})
	}
}

// TestVerifyCountsEveryImageOfARequest: a server record listing two images (vision_images) makes
// the recount's mq_image_tokens their sum, so the export, written when the record held one
// image's tokens, is named as differing.
func TestVerifyCountsEveryImageOfARequest(t *testing.T) {
	dir := copyRun(t, "vision")
	editLine(t, filepath.Join(dir, serverRecordsFile), `"request_id":"ff2eca7d-1"`, func(v map[string]any) {
		first := v["vision"].(map[string]any)
		second := map[string]any{}
		for k, x := range first {
			second[k] = x
		}
		second["image_tokens"] = json.Number("12")
		v["vision_images"] = []any{first, second}
	})
	wantAll(t, mustFail(t, dir), "profile_export.jsonl ff2eca7d-1 mq_image_tokens: reported 4, the records give 16")
}
