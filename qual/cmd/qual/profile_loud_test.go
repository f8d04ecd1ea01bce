package main

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/modelqual/modelqual/qual/launch/launchtest"
	"github.com/modelqual/modelqual/reports"
)

// captureStderr runs f with os.Stderr redirected and returns what it printed.
func captureStderr(t *testing.T, f func()) string {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	old := os.Stderr
	os.Stderr = w
	done := make(chan []byte)
	go func() { b, _ := io.ReadAll(r); done <- b }()
	f()
	w.Close()
	os.Stderr = old
	return string(<-done)
}

// failingServer is an OpenAI-shaped server whose completions fail: every one with 400, or
// (half) every second one with 500. /health and /v1/models answer so the external launcher
// accepts it.
func failingServer(t *testing.T, half bool) *httptest.Server {
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/health":
			w.WriteHeader(200)
		case "/v1/models":
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, `{"object":"list","data":[{"id":"m","object":"model"}]}`)
		default:
			io.Copy(io.Discard, r.Body)
			if half && n.Add(1)%2 == 0 {
				w.Header().Set("Content-Type", "application/json")
				io.WriteString(w, `{"id":"x","object":"text_completion","choices":[{"index":0,"text":" ok","finish_reason":"length"}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}`)
				return
			}
			code, typ := 400, "invalid_request_error"
			if half {
				code, typ = 500, "server_error"
			}
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(code)
			io.WriteString(w, `{"error":{"message":"refused by the test server","type":"`+typ+`","param":null,"code":null}}`)
		}
	}))
	t.Cleanup(srv.Close)
	return srv
}

func runProfileExternal(t *testing.T, url, out string, extra ...string) (code int, stderr string) {
	args := append([]string{"--url", url, "--model", "m", "--tokenizer", launchtest.TokenizerDir(t, "gpt2"),
		"--input-tokens-mean", "8", "--num-prompts", "4", "--concurrency", "2", "--requests", "10",
		"--out", out, "--no-progress", "--source-root", "none"}, extra...)
	stderr = captureStderr(t, func() {
		captureStdout(t, func() { code = runProfile(args) })
	})
	return code, stderr
}

func TestProfileAllFailedExitsNonZero(t *testing.T) {
	srv := failingServer(t, false)
	code, stderr := runProfileExternal(t, srv.URL, t.TempDir())
	if code == 0 || !strings.Contains(stderr, "0 of 10 requests succeeded") || !strings.Contains(stderr, "400") {
		t.Fatalf("exit %d, stderr:\n%s\nwant non-zero with \"0 of 10 requests succeeded\" and the 400", code, stderr)
	}
}

func TestProfileMaxErrorRate(t *testing.T) {
	srv := failingServer(t, true)
	code, stderr := runProfileExternal(t, srv.URL, t.TempDir(), "--max-error-rate", "0.2")
	if code == 0 || !strings.Contains(stderr, "5 of 10 requests failed") || !strings.Contains(stderr, "--max-error-rate 0.2") {
		t.Fatalf("exit %d, stderr:\n%s\nwant non-zero naming 5 of 10 failed over --max-error-rate 0.2", code, stderr)
	}
	// The same run within a looser limit passes.
	if code, stderr := runProfileExternal(t, srv.URL, t.TempDir(), "--max-error-rate", "0.6"); code != 0 {
		t.Fatalf("exit %d within the limit: %s", code, stderr)
	}
}

func TestProfileDeadURLNamesIt(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "http://" + l.Addr().String()
	l.Close() // nothing listens there now
	code, stderr := runProfileExternal(t, dead, t.TempDir())
	if code == 0 || !strings.Contains(stderr, dead) || !strings.Contains(stderr, "nothing accepts connections") {
		t.Fatalf("exit %d, stderr:\n%s\nwant a failure naming %s", code, stderr, dead)
	}
}

func TestProfileRefusesExistingOut(t *testing.T) {
	srv := failingServer(t, true)
	out := t.TempDir()
	if err := os.WriteFile(filepath.Join(out, "profile_export.jsonl"), []byte("{}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	code, stderr := runProfileExternal(t, srv.URL, out)
	if code == 0 || !strings.Contains(stderr, "already holds a run") || !strings.Contains(stderr, "--overwrite") {
		t.Fatalf("exit %d, stderr:\n%s\nwant a refusal naming --overwrite", code, stderr)
	}
	if b, _ := os.ReadFile(filepath.Join(out, "profile_export.jsonl")); string(b) != "{}\n" {
		t.Errorf("the existing run was touched: %q", b)
	}
	if code, stderr := runProfileExternal(t, srv.URL, out, "--overwrite"); code != 0 {
		t.Fatalf("--overwrite: exit %d: %s", code, stderr)
	}
}

// TestProfileReplaysMooncakeAndMultiTurn: AIPerf's commands carry over: a Mooncake trace
// with --fixed-schedule and a multi_turn file in a closed loop, against qual-server, with the
// schedule lateness reported for the trace and session and turn in every record.
func TestProfileReplaysMooncakeAndMultiTurn(t *testing.T) {
	dir := t.TempDir()
	trace := filepath.Join(dir, "trace.jsonl")
	os.WriteFile(trace, []byte(`{"timestamp": 5000, "input_length": 20, "output_length": 3, "hash_ids": [1]}
{"timestamp": 5030, "input_length": 30, "output_length": 2, "hash_ids": [1]}
{"timestamp": 5075, "input_length": 12, "output_length": 4, "hash_ids": [2]}
`), 0o644)
	out, table := profileMock(t, "--input-file", trace, "--custom-dataset-type", "mooncake_trace", "--fixed-schedule")
	if !strings.Contains(table, "schedule lateness p50") || !strings.Contains(table, "(pacer: ") {
		t.Errorf("the printed summary of a trace replay does not report its lateness and pacer:\n%s", table)
	}
	s, err := reports.ReadSummary(filepath.Join(out, "profile-trace"))
	if err != nil {
		t.Fatal(err)
	}
	if s.Profiling.Requests != 3 || s.Sweep == nil || s.Sweep.Parameter != "fixed_schedule" {
		t.Fatalf("trace replay: %d requests, sweep %+v", s.Profiling.Requests, s.Sweep)
	}
	if l, ok := s.Profiling.Stat(reports.TagScheduleLateness, "p99"); !ok || l < 0 {
		t.Errorf("schedule lateness p99 %v (present %v)", l, ok)
	}
	isl := s.Profiling.Metrics[reports.TagInputSequenceLength].Dist
	if isl == nil || isl.Min != 12 || isl.Max != 30 {
		t.Errorf("input lengths %+v, want the trace's 12..30 tokens", isl)
	}

	conv := filepath.Join(dir, "conv.jsonl")
	os.WriteFile(conv, []byte(`{"session_id": "a", "turns": [{"text": "hello there", "output_length": 3}, {"text": "and then?", "delay": 5, "output_length": 3}]}
{"session_id": "b", "turns": [{"text": "one more", "output_length": 2}, {"text": "go on", "output_length": 2}, {"text": "last", "output_length": 2}]}
`), 0o644)
	out, _ = profileMock(t, "--input-file", conv, "--custom-dataset-type", "multi_turn", "--concurrency", "2")
	run, err := reports.ReadRun(filepath.Join(out, "profile-c2"))
	if err != nil {
		t.Fatal(err)
	}
	turns := map[string][]int{}
	for _, r := range run.Records {
		if r.Metadata.ConversationID == nil {
			t.Fatalf("record %s has no conversation_id", r.Metadata.XRequestID)
		}
		turns[*r.Metadata.ConversationID] = append(turns[*r.Metadata.ConversationID], r.Metadata.TurnIndex)
	}
	if len(run.Records) != 5 || len(turns["a"]) != 2 || len(turns["b"]) != 3 {
		t.Errorf("records %d, turns %v; want sessions a (2 turns) and b (3 turns)", len(run.Records), turns)
	}
}

// TestProfileRepeatFeedsCompare: --repeat 2 writes two run directories per point, and two such
// profiles compare over runs, each column naming its two runs.
func TestProfileRepeatFeedsCompare(t *testing.T) {
	base, _ := profileMock(t, "--concurrency", "2", "--requests", "8", "--output-tokens", "3", "--repeat", "2")
	cand, _ := profileMock(t, "--concurrency", "2", "--requests", "8", "--output-tokens", "3", "--repeat", "2")
	for _, d := range []string{"profile-c2-rep1", "profile-c2-rep2"} {
		if _, err := os.Stat(filepath.Join(base, d, reports.ProfileExportJSONL)); err != nil {
			t.Fatalf("--repeat 2: %v", err)
		}
	}
	var out, errb strings.Builder
	if code := reportMain([]string{"compare", base, cand}, &out, &errb); code != 0 {
		t.Fatalf("compare exit %d: %s", code, errb.String())
	}
	if !regexp.MustCompile(`base:\s+2 runs`).MatchString(out.String()) || !strings.Contains(out.String(), "candidate: 2 runs") || !strings.Contains(out.String(), "over runs") {
		t.Errorf("compare of repeats:\n%s", out.String())
	}
}
