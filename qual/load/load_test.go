package load

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelqual/modelqual/qual/client"
	"github.com/modelqual/modelqual/qual/records"
)

// fakeServer is a minimal OpenAI-compatible completions server that streams n tokens and
// tracks in-flight requests and the request IDs it saw.
type fakeServer struct {
	*httptest.Server
	inflight, maxInflight atomic.Int64
	mu                    sync.Mutex
	ids                   []string
	bodies                []string
	block                 bool // stream one token, then wait for the client to go away
}

func newFakeServer(t *testing.T, block bool) *fakeServer {
	f := &fakeServer{block: block}
	f.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := f.inflight.Add(1)
		defer f.inflight.Add(-1)
		for {
			m := f.maxInflight.Load()
			if n <= m || f.maxInflight.CompareAndSwap(m, n) {
				break
			}
		}
		body, _ := io.ReadAll(r.Body)
		f.mu.Lock()
		f.ids = append(f.ids, r.Header.Get("X-Request-Id"))
		f.bodies = append(f.bodies, string(body))
		f.mu.Unlock()
		stream := strings.Contains(string(body), `"stream":true`)
		if !stream {
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, `{"choices":[{"text":"a b c","finish_reason":"length"}],"usage":{"prompt_tokens":2,"completion_tokens":3}}`)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		for i := 0; i < 3; i++ {
			fmt.Fprintf(w, "data: {\"choices\":[{\"text\":\"t%d \"}]}\n\n", i)
			w.(http.Flusher).Flush()
			if f.block {
				<-r.Context().Done()
				return
			}
		}
		io.WriteString(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":2,\"completion_tokens\":3}}\n\ndata: [DONE]\n\n")
	}))
	t.Cleanup(f.Close)
	return f
}

func prompts(n int) []Prompt {
	var p []Prompt
	for i := 0; i < n; i++ {
		p = append(p, Prompt{Name: fmt.Sprint(i), Prompt: fmt.Sprintf("prompt %d", i), InputTokens: 2})
	}
	return p
}

func TestClosedLoopWarmupApart(t *testing.T) {
	f := newFakeServer(t, false)
	res, err := Run(context.Background(), Config{BaseURL: f.URL, Model: "m", Endpoint: client.Completions, Stream: true,
		Concurrency: 4, Requests: 20, Warmup: 3, Prompts: prompts(5), OutputTokens: 3, Seed: 7})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Records) != 23 {
		t.Fatalf("records = %d, want 23", len(res.Records))
	}
	ids := map[string]bool{}
	warm := 0
	for i, r := range res.Records {
		if ids[r.RequestID] {
			t.Fatalf("duplicate request id %s", r.RequestID)
		}
		ids[r.RequestID] = true
		if r.Error != nil {
			t.Fatalf("record %d failed: %+v", i, r.Error)
		}
		if r.Phase == records.PhaseWarmup {
			warm++
			if i >= 3 {
				t.Errorf("warmup record %d after the measured ones started", i)
			}
		}
		if len(r.ChunkNs) != 3 || r.OutputTokensServer != 3 || r.InputTokens != 2 || r.EndNs < r.ChunkNs[2] {
			t.Errorf("record %d: chunks %v out %d in %d end %d", i, r.ChunkNs, r.OutputTokensServer, r.InputTokens, r.EndNs)
		}
	}
	if warm != 3 {
		t.Errorf("warmup records = %d, want 3", warm)
	}
	f.mu.Lock()
	for _, id := range f.ids {
		if !ids[id] {
			t.Errorf("server saw id %q the client did not record", id)
		}
	}
	f.mu.Unlock()
	if m := f.maxInflight.Load(); m > 4 {
		t.Errorf("max in flight %d exceeds concurrency 4", m)
	}
	if res.Seed != 7 || res.Mode != "concurrency" {
		t.Errorf("seed %d mode %s", res.Seed, res.Mode)
	}
}

// A prompt's own output length is its requests' max_tokens; the others take the run's.
func TestPromptOutputLengthIsMaxTokens(t *testing.T) {
	f := newFakeServer(t, false)
	ps := prompts(3)
	ps[1].OutputTokens, ps[2].OutputTokens = 5, 9
	if _, err := Run(context.Background(), Config{BaseURL: f.URL, Model: "m", Endpoint: client.Completions,
		Concurrency: 1, Requests: 6, Prompts: ps, OutputTokens: 3, Seed: 7}); err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.bodies) != 6 {
		t.Fatalf("server saw %d requests, want 6", len(f.bodies))
	}
	for i, b := range f.bodies {
		var body struct {
			MaxTokens int  `json:"max_tokens"`
			IgnoreEOS bool `json:"ignore_eos"`
		}
		if err := json.Unmarshal([]byte(b), &body); err != nil {
			t.Fatal(err)
		}
		if want := []int{3, 5, 9}[i%3]; body.MaxTokens != want || !body.IgnoreEOS {
			t.Errorf("request %d: max_tokens %d ignore_eos %v, want %d and true", i, body.MaxTokens, body.IgnoreEOS, want)
		}
	}
}

func TestMixWarmupIntoMeasurementPlantsDefect(t *testing.T) {
	f := newFakeServer(t, false)
	res, err := Run(context.Background(), Config{BaseURL: f.URL, Endpoint: client.Completions, Concurrency: 2,
		Requests: 4, Warmup: 2, Prompts: prompts(1), MixWarmupIntoMeasurement: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range res.Records {
		if r.Phase != records.PhaseProfiling {
			t.Fatalf("planted defect should label every request profiling, got %q", r.Phase)
		}
	}
}

func TestOpenLoopScheduleAndLateness(t *testing.T) {
	f := newFakeServer(t, false)
	res, err := Run(context.Background(), Config{BaseURL: f.URL, Endpoint: client.Completions, RequestRate: 200, Arrival: ArrivalConstant,
		Requests: 40, Prompts: prompts(3), Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Records) != 40 || res.Mode != "request_rate" {
		t.Fatalf("records %d mode %s", len(res.Records), res.Mode)
	}
	if res.Pacer == "" {
		t.Error("an open loop's Result.Pacer is empty; it must say how the schedule was kept")
	}
	for i, r := range res.Records {
		if r.SessionNum != i {
			t.Fatalf("record %d has session %d", i, r.SessionNum)
		}
		if r.LatenessNs < 0 {
			t.Errorf("request %d started %d ns before its schedule", i, -r.LatenessNs)
		}
		if i > 0 {
			if gap := r.ScheduledNs - res.Records[i-1].ScheduledNs; gap < 4999000 || gap > 5001000 {
				t.Errorf("constant 200 req/s: schedule gap %d ns, want 5 ms", gap)
			}
		}
	}
}

func TestPoissonScheduleReproducible(t *testing.T) {
	f := newFakeServer(t, false)
	sched := func() []int64 {
		res, err := Run(context.Background(), Config{BaseURL: f.URL, Endpoint: client.Completions, RequestRate: 500,
			Arrival: ArrivalPoisson, Requests: 20, Prompts: prompts(1), Seed: 42})
		if err != nil {
			t.Fatal(err)
		}
		var out []int64
		for _, r := range res.Records {
			out = append(out, r.ScheduledNs-res.Records[0].ScheduledNs)
		}
		return out
	}
	a, b := sched(), sched()
	distinct := map[int64]bool{}
	for i := range a {
		if a[i] != b[i] {
			t.Fatalf("same seed, different schedules at %d: %d vs %d", i, a[i], b[i])
		}
		if i > 0 {
			distinct[a[i]-a[i-1]] = true
		}
	}
	if len(distinct) < 10 {
		t.Errorf("Poisson gaps look constant: %d distinct of 19", len(distinct))
	}
}

func TestOpenLoopConcurrencyCap(t *testing.T) {
	f := newFakeServer(t, false)
	res, err := Run(context.Background(), Config{BaseURL: f.URL, Endpoint: client.Completions, Stream: true, RequestRate: 5000,
		MaxConcurrency: 2, Requests: 30, Prompts: prompts(1)})
	if err != nil {
		t.Fatal(err)
	}
	if m := f.maxInflight.Load(); m > 2 {
		t.Errorf("max in flight %d exceeds the cap 2", m)
	}
	if len(res.Records) != 30 {
		t.Errorf("records %d", len(res.Records))
	}
}

func TestCancelRate(t *testing.T) {
	f := newFakeServer(t, true) // never finishes on its own: only cancellation ends requests
	res, err := Run(context.Background(), Config{BaseURL: f.URL, Endpoint: client.Completions, Stream: true, Concurrency: 4,
		Requests: 8, Prompts: prompts(1), CancelRate: 1, CancelDelay: 5 * time.Millisecond, Seed: 3})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range res.Records {
		if !r.Cancelled || r.Error == nil || r.Error.Code != records.CancelledCode || r.CancelNs < int64(5*time.Millisecond) {
			t.Fatalf("record %+v: want cancelled with code 499 after 5ms", r)
		}
	}
}

func TestDurationStops(t *testing.T) {
	f := newFakeServer(t, false)
	res, err := Run(context.Background(), Config{BaseURL: f.URL, Endpoint: client.Completions, Concurrency: 2,
		Duration: 100 * time.Millisecond, Prompts: prompts(1)})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Records) == 0 {
		t.Fatal("no requests in 100ms")
	}
	if el := time.Duration(res.ProfilingEndNs - res.ProfilingStartNs); el > 5*time.Second {
		t.Errorf("a 100ms run took %v", el)
	}
}

func TestValidateNamesField(t *testing.T) {
	cases := map[string]Config{
		"Endpoint":    {BaseURL: "http://x", Endpoint: "embeddings", Concurrency: 1, Requests: 1, Prompts: prompts(1)},
		"Concurrency": {BaseURL: "http://x", Endpoint: "chat", Requests: 1, Prompts: prompts(1)},
		"Requests":    {BaseURL: "http://x", Endpoint: "chat", Concurrency: 1, Prompts: prompts(1)},
		"Prompts":     {BaseURL: "http://x", Endpoint: "chat", Concurrency: 1, Requests: 1},
		"CancelRate":  {BaseURL: "http://x", Endpoint: "chat", Concurrency: 1, Requests: 1, Prompts: prompts(1), CancelRate: 2},
	}
	for field, c := range cases {
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), field) {
			t.Errorf("%s: err = %v", field, err)
		}
	}
}

// The recorded input_config says what each prompt asked for when prompts have lengths of
// their own (a manifest's output_tokens_stddev), and nothing more when none has.
func TestDescribeConfigRecordsPromptOutputLengths(t *testing.T) {
	ps := prompts(3)
	if _, ok := describeConfig(Config{Prompts: ps, OutputTokens: 8}, &Result{})["prompt_output_tokens"]; ok {
		t.Error("prompt_output_tokens recorded although no prompt has a length of its own")
	}
	ps, err := DrawOutputLengths(ps, 8, 3, 1)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := describeConfig(Config{Prompts: ps, OutputTokens: 8}, &Result{})["prompt_output_tokens"].([]int)
	if len(got) != 3 || got[0] != ps[0].OutputTokens || got[2] != ps[2].OutputTokens {
		t.Errorf("prompt_output_tokens %v, want the prompts' lengths %d %d %d", got, ps[0].OutputTokens, ps[1].OutputTokens, ps[2].OutputTokens)
	}
}
