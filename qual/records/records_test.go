package records

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func TestJSONLRoundTrip(t *testing.T) {
	in := []Request{
		{RequestID: "a", Phase: PhaseProfiling, Stream: true, ChunkNs: []int64{1, 2, 3}, EndNs: 3, HTTPStatus: 200},
		{RequestID: "b", Phase: PhaseWarmup, Error: &Error{Code: 500, Type: "server_error", Message: "x"}},
	}
	p := filepath.Join(t.TempDir(), "sub", "client.jsonl")
	if err := WriteJSONL(p, in); err != nil {
		t.Fatal(err)
	}
	out, err := ReadJSONL[Request](p)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(in, out) {
		t.Errorf("round trip:\n in %+v\nout %+v", in, out)
	}
}

func TestReadServerLine(t *testing.T) {
	// One line as qual-server writes it (server.Record); worker_id may be a number or a string.
	line := `{"request_id":"r1","route":"/v1/completions","model":"m","status":200,"stream":true,` +
		`"start_unix_ns":5,"http_latency_ns":100,"queue_wait_ns":3,"task_wall_ns":90,"task_ttft_ns":10,` +
		`"input_tokens":4,"output_tokens":8,"finish_reason":"length","error_type":"","error_message":"",` +
		`"prompt_sha256":"ab","prompt_bytes":12,"output_sha256":"cd","output_bytes":30,"worker_id":2}` + "\n\n" +
		`{"request_id":"r2","route":"/tokenize","status":200,"worker_id":"w-1"}` + "\n"
	p := filepath.Join(t.TempDir(), "server.jsonl")
	if err := os.WriteFile(p, []byte(line), 0o644); err != nil {
		t.Fatal(err)
	}
	sv, err := ReadServer(p)
	if err != nil {
		t.Fatal(err)
	}
	want := Server{RequestID: "r1", Route: "/v1/completions", Model: "m", Status: 200, Stream: true, StartUnixNs: 5,
		HTTPLatencyNs: 100, QueueWaitNs: 3, TaskWallNs: 90, TaskTTFTNs: 10, InputTokens: 4, OutputTokens: 8,
		FinishReason: "length", PromptSHA256: "ab", PromptBytes: 12, OutputSHA256: "cd", OutputBytes: 30, WorkerID: "2"}
	if len(sv) != 2 || !reflect.DeepEqual(sv[0], want) || sv[1].WorkerID != "w-1" {
		t.Errorf("ReadServer = %+v", sv)
	}
	if got := SelectRoutes(sv, "/v1/"); len(got) != 1 || got[0].RequestID != "r1" {
		t.Errorf("SelectRoutes(/v1/) = %+v", got)
	}
	bad := filepath.Join(t.TempDir(), "bad.jsonl")
	os.WriteFile(bad, []byte(line+"{not json\n"), 0o644)
	if _, err := ReadServer(bad); err == nil || !strings.Contains(err.Error(), "line 4") {
		t.Errorf("malformed line: err = %v, want it to name line 4", err)
	}
}

func TestJoin(t *testing.T) {
	cl := []Request{{RequestID: "a", EndNs: 50}, {RequestID: "b", EndNs: 70}}
	sv := []Server{{RequestID: "b", TaskWallNs: 60, QueueWaitNs: 4}, {RequestID: "a", TaskWallNs: 45}}
	j, err := Join(cl, sv)
	if err != nil {
		t.Fatal(err)
	}
	if len(j.Requests) != 2 || j.Requests[0].RequestID != "a" || j.Requests[0].HTTPMinusTaskNs != 5 ||
		j.Requests[1].HTTPMinusTaskNs != 10 || j.Requests[1].QueueWaitNs != 4 || j.Requests[1].HTTPLatencyNs != 70 {
		t.Errorf("Join = %+v", j.Requests)
	}

	// Unmatched on both sides and duplicates: every ID is named.
	cl = append(cl, Request{RequestID: "only-client"}, Request{RequestID: "a"})
	sv = append(sv, Server{RequestID: "only-server"}, Server{RequestID: "b"})
	j, err = Join(cl, sv)
	if err == nil {
		t.Fatal("Join accepted unmatched IDs")
	}
	for _, want := range []string{"only-client", "only-server", "duplicated in client records: a", "duplicated in server records: b"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("join error %q does not mention %q", err, want)
		}
	}
	if len(j.Requests) != 2 {
		t.Errorf("matched part on error = %d requests, want 2", len(j.Requests))
	}
}
