package load

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelqual/modelqual/qual/client"
	"github.com/modelqual/modelqual/server/tokenizer"
)

func gpt2Tok(t testing.TB) *tokenizer.Tokenizer {
	t.Helper()
	root, err := filepath.Abs("../../fixtures")
	if err != nil {
		t.Fatal(err)
	}
	var dir string
	filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err == nil && dir == "" && d.Name() == "tokenizer.json" && strings.Contains(p, "gpt2") {
			dir = filepath.Dir(p)
		}
		return nil
	})
	if dir == "" {
		t.Skip("no gpt2 tokenizer under fixtures/")
	}
	tok, err := tokenizer.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func writeLines(t *testing.T, lines ...string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "in.jsonl")
	if err := os.WriteFile(p, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestMooncakeTraceReplaysOnSchedule: a Mooncake trace's requests are sent at their
// timestamps (never before; the lateness against the trace is recorded), with prompts of
// exactly input_length tokens in which equal hash IDs are equal text.
func TestMooncakeTraceReplaysOnSchedule(t *testing.T) {
	tok := gpt2Tok(t)
	path := writeLines(t,
		`{"timestamp": 1000, "input_length": 600, "output_length": 3, "hash_ids": [7, 8]}`,
		`{"timestamp": 1040, "input_length": 300, "output_length": 2, "hash_ids": [7]}`,
		`{"timestamp": 1100, "input_length": 40, "output_length": 4, "hash_ids": [9]}`,
		`{"timestamp": 1130, "input_length": 512, "output_length": 4, "hash_ids": [7]}`)
	ds, err := ReadDataset(path, DatasetMooncakeTrace, tok)
	if err != nil {
		t.Fatal(err)
	}
	if !ds.Timed || len(ds.Sessions) != 4 {
		t.Fatalf("dataset %+v", ds)
	}
	wantTS := []float64{0, 40, 100, 130}
	wantLen := []int{600, 300, 40, 512}
	for i, s := range ds.Sessions {
		p := s.Turns[0].Prompt
		if *s.Turns[0].TimestampMs != wantTS[i] || p.InputTokens != wantLen[i] || p.OutputTokens != []int{3, 2, 4, 4}[i] {
			t.Errorf("line %d: ts %v tokens %d out %d, want %v %d", i, *s.Turns[0].TimestampMs, p.InputTokens, p.OutputTokens, wantTS[i], wantLen[i])
		}
	}
	// hash 7 is the first block of lines 1, 2 and 4: the same text.
	block7 := ds.Sessions[3].Turns[0].Prompt.Prompt
	if !strings.HasPrefix(ds.Sessions[0].Turns[0].Prompt.Prompt, block7[:200]) || !strings.HasPrefix(ds.Sessions[1].Turns[0].Prompt.Prompt, block7[:200]) {
		t.Error("equal hash IDs did not give equal prefixes")
	}
	if strings.HasPrefix(ds.Sessions[2].Turns[0].Prompt.Prompt, block7[:100]) {
		t.Error("hash 9 gave hash 7's text")
	}

	f := newFakeServer(t, false)
	res, err := Run(context.Background(), Config{BaseURL: f.URL, Endpoint: client.Completions, Stream: true,
		Sessions: ds.Sessions, FixedSchedule: true, Seed: 3})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Records) != 4 || res.Mode != "fixed_schedule" {
		t.Fatalf("records %d mode %s", len(res.Records), res.Mode)
	}
	start := res.Records[0].ScheduledNs
	for i, r := range res.Records {
		if r.Error != nil {
			t.Fatalf("request %d: %+v", i, r.Error)
		}
		if got := time.Duration(r.ScheduledNs - start); got != time.Duration(wantTS[i]*float64(time.Millisecond)) {
			t.Errorf("request %d scheduled at +%v, want +%vms", i, got, wantTS[i])
		}
		if r.LatenessNs < 0 {
			t.Errorf("request %d sent %d ns before its timestamp", i, -r.LatenessNs)
		}
		if r.InputTokens != wantLen[i] {
			t.Errorf("request %d input tokens %d, want %d", i, r.InputTokens, wantLen[i])
		}
	}
	// Every body asked for its line's output length.
	for i, b := range f.bodies {
		var body struct {
			MaxTokens int `json:"max_tokens"`
		}
		json.Unmarshal([]byte(b), &body)
		if body.MaxTokens < 2 || body.MaxTokens > 4 {
			t.Errorf("body %d max_tokens %d", i, body.MaxTokens)
		}
	}
}

// TestMultiTurnHistoryGrowsWithDelays: a multi_turn session's turns go one after another,
// each carrying the earlier turns and answers, each sent no earlier than its delay after
// the previous turn ended; records carry the session and turn.
func TestMultiTurnHistoryGrowsWithDelays(t *testing.T) {
	path := writeLines(t,
		`{"session_id": "s1", "turns": [{"text": "first question"}, {"text": "second question", "delay": 30}, {"text": "third question", "delay": 20}]}`,
		`{"session_id": "s2", "turns": [{"text": "other start"}, {"text": "other follow-up", "delay": 10}]}`)
	ds, err := ReadDataset(path, DatasetMultiTurn, nil)
	if err != nil {
		t.Fatal(err)
	}
	f := newFakeServer(t, false)
	res, err := Run(context.Background(), Config{BaseURL: f.URL, Endpoint: client.Chat, Stream: true,
		Sessions: ds.Sessions, Concurrency: 2, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Records) != 5 {
		t.Fatalf("%d records, want 5", len(res.Records))
	}
	byID := map[string][]int{}
	for i, r := range res.Records {
		byID[r.ConversationID] = append(byID[r.ConversationID], i)
	}
	for sid, idx := range byID {
		for k, i := range idx {
			r := res.Records[i]
			if r.TurnIndex != k {
				t.Errorf("%s: record %d has turn %d, want %d", sid, i, r.TurnIndex, k)
			}
			if k == 0 {
				continue
			}
			prev := res.Records[idx[k-1]]
			delay := map[string][]int64{"s1": {0, 30, 20}, "s2": {0, 10}}[sid][k]
			gap := (r.StartUnixNs) - (prev.StartUnixNs + prev.EndNs)
			if gap < delay*int64(time.Millisecond)-int64(time.Millisecond) { // wall clock: 1 ms slack for the reading
				t.Errorf("%s turn %d started %v after turn %d ended, want at least its delay %d ms", sid, k, time.Duration(gap), k-1, delay)
			}
		}
	}
	// The server saw s1's third turn with the whole history: 5 messages, the answers included.
	found := false
	for _, b := range f.bodies {
		var body struct {
			Messages []map[string]string `json:"messages"`
		}
		json.Unmarshal([]byte(b), &body)
		if n := len(body.Messages); n > 0 && body.Messages[n-1]["content"] == "third question" {
			found = true
			roles := []string{}
			for _, m := range body.Messages {
				roles = append(roles, m["role"]+":"+m["content"])
			}
			want := "user:first question|assistant:t0 t1 t2 |user:second question|assistant:t0 t1 t2 |user:third question"
			if strings.Join(roles, "|") != want {
				t.Errorf("third turn's messages\n got %s\nwant %s", strings.Join(roles, "|"), want)
			}
		}
	}
	if !found {
		t.Error("no request carried the third turn")
	}
}

func TestDatasetErrorsNameTheField(t *testing.T) {
	for typ, tc := range map[string]struct{ line, want string }{
		DatasetSingleTurn:    {`{"texts": []}`, `no "text"`},
		DatasetMultiTurn:     {`{"session_id": "a"}`, `no "turns"`},
		DatasetMooncakeTrace: {`{"input_length": 5}`, `no "timestamp"`},
		DatasetRandomPool:    {`{"text": "x", "output_length": -2}`, "output_length -2"},
	} {
		_, err := ReadDataset(writeLines(t, tc.line), typ, gpt2Tok(t))
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "line 1") {
			t.Errorf("%s: %v, want an error naming line 1 and %s", typ, err, tc.want)
		}
	}
	if _, err := ReadDataset(writeLines(t, `{"text":"x"}`), "sharegpt", nil); err == nil || !strings.Contains(err.Error(), "mooncake_trace") {
		t.Errorf("unknown type: %v", err)
	}
}

// A trace longer than the run: with Duration the replay ends at the duration (sends due after
// it are not made, and the run does not wait out the trace), with Requests after that many
// sends, and with a cancelled context promptly; every send has its record and none is made for
// a turn never sent. Records are numbered in the order of their instants.
func TestFixedScheduleStopsAtDurationCountAndCancel(t *testing.T) {
	f := newFakeServer(t, false)
	trace := func(n int, gapMs float64) []Session {
		ss := make([]Session, n)
		for i := range ss {
			ts := float64(n-1-i) * gapMs // queued in reverse order of their instants
			ss[i] = Session{ID: fmt.Sprint(i), Turns: []Turn{{Prompt: Prompt{Prompt: "x", InputTokens: 1}, TimestampMs: &ts}}}
		}
		return ss
	}
	check := func(name string, res *Result, wantMax int, within time.Duration, took time.Duration) {
		t.Helper()
		if took > within {
			t.Errorf("%s: the run took %v, want under %v (it waited out the trace?)", name, took, within)
		}
		if len(res.Records) == 0 || len(res.Records) > wantMax {
			t.Errorf("%s: %d records, want 1..%d", name, len(res.Records), wantMax)
		}
		for i, r := range res.Records {
			cutByRunEnd := name == "cancel" && r.Error != nil && r.Error.Type == "RunCancelled"
			if r.SessionNum != i || r.Error != nil && !cutByRunEnd {
				t.Fatalf("%s: record %d: number %d error %+v", name, i, r.SessionNum, r.Error)
			}
			if i > 0 && r.ScheduledNs < res.Records[i-1].ScheduledNs {
				t.Fatalf("%s: record %d scheduled before record %d: numbers do not follow the instants", name, i, i-1)
			}
		}
	}
	// 200 turns 100 ms apart: a 20 s trace, which a run that waits it out cannot hide even on a
	// loaded machine (the bound below is half of it).
	start := time.Now()
	res, err := Run(context.Background(), Config{BaseURL: f.URL, Endpoint: client.Completions, Sessions: trace(200, 100),
		FixedSchedule: true, Duration: 300 * time.Millisecond, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	check("duration", res, 4, 10*time.Second, time.Since(start))

	start = time.Now()
	res, err = Run(context.Background(), Config{BaseURL: f.URL, Endpoint: client.Completions, Sessions: trace(200, 100),
		FixedSchedule: true, Requests: 3, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	check("count", res, 3, 10*time.Second, time.Since(start))
	if len(res.Records) != 3 {
		t.Errorf("count: %d records, want 3", len(res.Records))
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	time.AfterFunc(250*time.Millisecond, cancel)
	start = time.Now()
	res, err = Run(ctx, Config{BaseURL: f.URL, Endpoint: client.Completions, Sessions: trace(200, 100), FixedSchedule: true, Seed: 1})
	if err == nil {
		t.Error("a cancelled run returned no error")
	}
	check("cancel", res, 4, 10*time.Second, time.Since(start))
}
