package spec

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/modelqual/modelqual/qual/records"
)

// TestVerifyRunsOfTheLoadGate: the load gate's recomputation passes runs of qual profile and
// fails, naming the figure, a run whose summary was edited.
func TestVerifyRunsOfTheLoadGate(t *testing.T) {
	root := filepath.Join("..", "recount", "testdata")
	lines, problems := verifyRuns([]string{root})
	if len(problems) > 0 || len(lines) != 5 { // the runs of ../recount/testdata
		t.Fatalf("verifyRuns(%s): %d runs, problems:\n%s", root, len(lines), strings.Join(problems, "\n"))
	}
	dir := t.TempDir()
	src := filepath.Join(root, "vision")
	ents, _ := os.ReadDir(src)
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if e.Name() == "summary.json" { // the profiling phase's request count, edited by hand
			dec := json.NewDecoder(strings.NewReader(string(b)))
			dec.UseNumber() // every other number kept exactly as written
			var v map[string]any
			if err := dec.Decode(&v); err != nil {
				t.Fatal(err)
			}
			v["profiling"].(map[string]any)["metrics"].(map[string]any)["request_count"].(map[string]any)["avg"] = 99
			if b, err = json.Marshal(v); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.WriteFile(filepath.Join(dir, e.Name()), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	_, problems = verifyRuns([]string{dir})
	if len(problems) != 1 || !strings.Contains(problems[0], "1 of ") ||
		!strings.Contains(problems[0], "summary.json profiling request_count: reported 99, the records give 12") {
		t.Errorf("want the edited request_count named, got:\n%s", strings.Join(problems, "\n"))
	}
}

// TestVerifyRecordFieldsAgainstResponses: a record that says other than the response, or a
// request with two records, is named with the field and both values.
func TestVerifyRecordFieldsAgainstResponses(t *testing.T) {
	path := filepath.Join(t.TempDir(), "records.jsonl")
	recs := []records.Server{
		{RequestID: "a", Route: "/v1/completions", Status: 200, InputTokens: 5, OutputTokens: 8, FinishReason: "length", OutputSHA256: hexSHA([]byte("hi")), OutputBytes: 2},
		{RequestID: "b", Route: "/v1/chat/completions", Status: 200, InputTokens: 5, OutputTokens: 9, FinishReason: "length"},
		{RequestID: "c", Route: "/v1/completions", Status: 400, ErrorType: "invalid_request_error"},
		{RequestID: "c", Route: "/v1/completions", Status: 400, ErrorType: "invalid_request_error"},
	}
	var b strings.Builder
	for _, r := range recs {
		line, _ := json.Marshal(r)
		b.Write(append(line, '\n'))
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	sent := []sentRequest{
		{what: "completions", records: path, id: "a", want: map[string]string{"route": "/v1/completions", "status": "200",
			"input_tokens": "5", "output_tokens": "8", "finish_reason": "length", "output_sha256": hexSHA([]byte("hi")), "output_bytes": "2"}},
		{what: "chat", records: path, id: "b", want: map[string]string{"output_tokens": "8", "finish_reason": "length"}},
		{what: "refused", records: path, id: "c", want: map[string]string{"status": "400"}},
	}
	got := strings.Join(compareRecords(context.Background(), sent), "\n")
	for _, want := range []string{`chat (request b): record output_tokens "9", the client received "8"`, "refused (request c): 2 server records, want exactly one"} {
		if !strings.Contains(got, want) {
			t.Errorf("want %q in:\n%s", want, got)
		}
	}
	if strings.Contains(got, "request a") {
		t.Errorf("a record equal to its response was reported:\n%s", got)
	}
}
