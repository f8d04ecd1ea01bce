package main

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelqual/modelqual/qual/launch/launchtest"
	"github.com/modelqual/modelqual/reports"
)

// checkFindMax reads a search's summary and checks what any search must hold: every point
// is a run directory of --out, judged by its own figures (a point passes exactly when each
// SLO's measured statistic meets its threshold), the answer is the highest passing value,
// and the value above it fails.
func checkFindMax(t *testing.T, out string) *reports.FindMax {
	t.Helper()
	fm, err := reports.ReadFindMax(filepath.Join(out, "profile-sweep"))
	if err != nil {
		t.Fatal(err)
	}
	md, err := os.ReadFile(filepath.Join(out, "profile-sweep", reports.SummaryMDFile))
	if err != nil || !strings.Contains(string(md), fm.Verdict) {
		t.Errorf("summary.md lacks the verdict %q (%v)", fm.Verdict, err)
	}
	best := 0.0
	for _, p := range fm.Points {
		s, err := reports.ReadSummary(filepath.Join(out, p.Dir))
		if err != nil {
			t.Fatalf("point %v: %v", p.Value, err)
		}
		if s.Sweep == nil || s.Sweep.Value != p.Value {
			t.Errorf("point %v: its run records sweep %+v", p.Value, s.Sweep)
		}
		pass := true
		for i, slo := range fm.SLOs {
			pass = pass && p.Measured[i] != nil && slo.Met(*p.Measured[i])
		}
		if pass != p.Pass {
			t.Errorf("point %v: pass %v but its figures %v say %v", p.Value, p.Pass, p.Measured, pass)
		}
		if p.Pass {
			best = max(best, p.Value)
		}
	}
	if best > 0 && (fm.Answer == nil || *fm.Answer != best) {
		t.Errorf("answer %v, want the highest passing point %v", fm.Answer, best)
	}
	return fm
}

// TestProfileFindMaxOnMock: the mock engine with one batch slot serves one request at a
// time, each for its 4 tokens' steps of 50 ms (S ≈ 200 ms), so a closed loop of C clients
// waits behind C−1 others: request latency ≈ C·S. With its p99 at most 750 ms, C = 3
// (≈ 600 ms) passes and C = 4 (≈ 800 ms) fails: the search (1, 2, 4, 3) answers 3. C = 3
// keeps passing while the server adds under 12.5 ms to a 50 ms step (a loaded machine adds
// a few), and C = 4 fails whatever it adds.
func TestProfileFindMaxOnMock(t *testing.T) {
	t.Setenv("MODELQUAL_BIN", filepath.Dir(launchtest.ServerBin(t)))
	bundle := launchtest.MockBundle(t, 50*time.Millisecond)
	out := filepath.Join(t.TempDir(), "out")
	var code int
	table := captureStdout(t, func() {
		code = runProfile([]string{"--bundle", bundle, "--model", "mock", "--endpoint", "completions", "--stream",
			"--server-arg=--max-batch=1", "--concurrency", "1", "--requests", "12", "--input-tokens-mean", "8",
			"--output-tokens", "4", "--find-max", "--slo", "e2e_p99:750ms", "--find-max-points", "6",
			"--out", out, "--no-progress", "--source-root", "none"})
	})
	if code != 0 {
		t.Fatalf("exit %d:\n%s", code, table)
	}
	fm := checkFindMax(t, out)
	t.Logf("%s\n%s", table, fm.Markdown())
	if fm.Parameter != "concurrency" || fm.Answer == nil || *fm.Answer != 3 || fm.Above == nil || *fm.Above != 4 {
		t.Errorf("%s; want 3, with 4 failing (C·S against 750 ms)", fm.Verdict)
	}
	if !strings.Contains(table, "find-max: Max concurrency meeting the SLOs: 3") {
		t.Errorf("printed summary lacks the answer:\n%s", table)
	}
}

// TestProfileFindMaxOnTinyFamily: a search end to end on qwen3-tiny served by qual-server
// (--family, the fixture bundle), open loop from 2 req/s.
func TestProfileFindMaxOnTinyFamily(t *testing.T) {
	t.Setenv("MODELQUAL_BIN", filepath.Dir(launchtest.ServerBin(t)))
	out := filepath.Join(t.TempDir(), "out")
	var code int
	table := captureStdout(t, func() {
		code = runProfile([]string{"--family", "qwen3-tiny", "--endpoint", "chat", "--stream", "--request-rate", "2",
			"--arrival", "constant", "--requests", "8", "--input-tokens-mean", "16", "--output-tokens", "8",
			"--find-max", "--slo", "ttft_p99:150ms,itl_p90:100ms", "--find-max-points", "3",
			"--out", out, "--no-progress", "--source-root", "none"})
	})
	if code != 0 {
		t.Fatalf("exit %d:\n%s", code, table)
	}
	fm := checkFindMax(t, out)
	t.Logf("%s\n%s", table, fm.Markdown())
	if fm.Parameter != "request_rate" || len(fm.Points) < 2 || fm.Points[0].Value != 2 {
		t.Errorf("search %+v", fm)
	}
	s, err := reports.ReadSummary(filepath.Join(out, fm.Points[0].Dir))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(s.InputConfig), `"model":"qwen3"`) && !strings.Contains(string(s.InputConfig), `"qwen3"`) {
		t.Errorf("--family qwen3-tiny did not serve the registry's name qwen3: %s", s.InputConfig)
	}
}

// bodyServer is an OpenAI-shaped completions/chat server that keeps every request body.
type bodyServer struct {
	*httptest.Server
	mu     sync.Mutex
	bodies []map[string]any
}

func newBodyServer(t *testing.T) *bodyServer {
	b := &bodyServer{}
	b.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/health":
			return
		case "/v1/models":
			io.WriteString(w, `{"object":"list","data":[{"id":"m","object":"model"}]}`)
			return
		}
		var body map[string]any
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
			w.WriteHeader(400)
			return
		}
		b.mu.Lock()
		b.bodies = append(b.bodies, body)
		b.mu.Unlock()
		w.Header().Set("Content-Type", "text/event-stream")
		chunk := `{"choices":[{"index":0,"text":"ok"}]}`
		if r.URL.Path == "/v1/chat/completions" {
			chunk = `{"choices":[{"index":0,"delta":{"content":"ok"}}]}`
		}
		io.WriteString(w, "data: "+chunk+"\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":1}}\n\ndata: [DONE]\n\n")
	}))
	t.Cleanup(b.Close)
	return b
}

// TestProfileExtraBodyInEveryRequest: --extra-body and --temperature reach every request
// (warmup and measured, completions and chat, text and image), and the run's configuration
// records the merged body, so that report compare keys runs by it.
func TestProfileExtraBodyInEveryRequest(t *testing.T) {
	for _, endpoint := range []string{"completions", "chat"} {
		srv := newBodyServer(t)
		out := filepath.Join(t.TempDir(), "out")
		args := []string{"--stream", "--endpoint", endpoint, "--warmup", "2", "--extra-body", `{"top_p":0.5,"seed":7}`, "--temperature", "0"}
		if endpoint == "chat" {
			args = append(args, "--image-width-mean", "16", "--image-height-mean", "16", "--image-fraction", "0.5")
		}
		if code, stderr := runProfileExternal(t, srv.URL, out, args...); code != 0 {
			t.Fatalf("%s: exit %d: %s", endpoint, code, stderr)
		}
		srv.mu.Lock()
		if len(srv.bodies) != 12 {
			t.Errorf("%s: %d requests, want 12", endpoint, len(srv.bodies))
		}
		images := 0
		for _, b := range srv.bodies {
			if b["temperature"] != 0.0 || b["top_p"] != 0.5 || b["seed"] != 7.0 || b["stream"] != true {
				t.Errorf("%s: body without the extra fields: %v", endpoint, b)
			}
			if m, _ := json.Marshal(b["messages"]); strings.Contains(string(m), "image_url") {
				images++
			}
		}
		srv.mu.Unlock()
		if endpoint == "chat" && images == 0 {
			t.Errorf("chat: no request carried an image")
		}
		run, err := reports.ReadRun(filepath.Join(out, "profile-c2"))
		if err != nil {
			t.Fatal(err)
		}
		if v, ok := reports.RunKey(run).Get("extra_body"); !ok || v != `{"seed":7,"temperature":0,"top_p":0.5}` {
			t.Errorf("%s: configuration key extra_body = %q (%v)", endpoint, v, ok)
		}
	}
}

func TestProfileExtraBodyRefusals(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--extra-body", `{"temperature":0`}, "--extra-body"},
		{[]string{"--extra-body", `[1,2]`}, "not an object"},
		{[]string{"--extra-body", `{"a":1} {"b":2}`}, "more than one JSON value"},
		{[]string{"--extra-body", `{"max_tokens":3}`}, "--output-tokens"},
		{[]string{"--extra-body", `{"temperature":1}`, "--temperature", "0"}, "give it once"},
		{[]string{"--temperature", "warm"}, "--temperature"},
		{[]string{"--find-max"}, "--find-max needs --slo"},
		{[]string{"--find-max", "--slo", "ttft_p99:1s", "--concurrency", "1,2"}, "starts from one value"},
		{[]string{"--find-max", "--slo", "ttft_p99x:1s"}, "--slo"},
		{[]string{"--ramp-up", "1s", "--fixed-schedule"}, "--fixed-schedule"},
		{[]string{"--family", "nosuch"}, `unknown family; known: `},
	} {
		args := append([]string{"--url", "http://127.0.0.1:1", "--model", "m", "--out", t.TempDir(), "--requests", "1"}, c.args...)
		if !strings.Contains(strings.Join(c.args, " "), "--concurrency") && !strings.Contains(strings.Join(c.args, " "), "fixed") {
			args = append(args, "--concurrency", "1")
		}
		var code int
		stderr := captureStderr(t, func() { code = runProfile(args) })
		if code != 2 || !strings.Contains(stderr, c.want) {
			t.Errorf("%v: exit %d, stderr %q; want 2 naming %q", c.args, code, stderr, c.want)
		}
	}
}
