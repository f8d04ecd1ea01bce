package load_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	mqbundle "github.com/modelqual/modelqual/native/bundle"
	"github.com/modelqual/modelqual/qual/client"
	"github.com/modelqual/modelqual/qual/launch"
	"github.com/modelqual/modelqual/qual/launch/launchtest"
	"github.com/modelqual/modelqual/qual/load"
	"github.com/modelqual/modelqual/qual/provenance"
	"github.com/modelqual/modelqual/qual/records"
	"github.com/modelqual/modelqual/reports"
	"github.com/modelqual/modelqual/server/tokenizer"
)

func gpt2(t *testing.T) *tokenizer.Tokenizer {
	t.Helper()
	tok, err := tokenizer.Load(launchtest.TokenizerDir(t, "gpt2"))
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func synthetic(t *testing.T, tok *tokenizer.Tokenizer, mean int) []load.Prompt {
	t.Helper()
	ps, err := load.Synthetic(tok, load.SyntheticOptions{Count: 10, Mean: mean, Stddev: mean / 4, Seed: 5})
	if err != nil {
		t.Fatal(err)
	}
	return ps
}

func TestProfileAgainstMockJoinsEveryID(t *testing.T) {
	tok := gpt2(t)
	bundle := launchtest.MockBundle(t, 0)
	ep := launchtest.Start(t, bundle)
	out := t.TempDir()
	res, err := load.Profile(context.Background(), load.ProfileInput{
		Endpoint: ep,
		Load: load.Config{Endpoint: client.Completions, Stream: true, Requests: 20, Warmup: 2,
			Prompts: synthetic(t, tok, 32), OutputTokens: 8, Tokenizer: tok, Seed: 9},
		Concurrencies: []int{1, 4},
		OutDir:        out,
		SLOs:          "ttft:10s",
		Fingerprint:   provenance.Spec{Bundle: bundle, TokenizerDir: launchtest.TokenizerDir(t, "gpt2")},
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Points) != 2 {
		t.Fatalf("points %d", len(res.Points))
	}
	for _, p := range res.Points {
		for _, f := range []string{reports.ProfileExportJSONL, reports.AIPerfJSONFile, reports.AIPerfCSVFile, reports.SummaryJSONFile,
			reports.SummaryMDFile, load.ClientRecordsFile, load.ServerRecordsFile, load.JoinedRecordsFile,
			load.ProvenanceFile, load.EnvironmentFile, "server.stderr.log"} {
			if _, err := os.Stat(filepath.Join(p.Dir, f)); err != nil {
				t.Errorf("%s: %v", filepath.Base(p.Dir), err)
			}
		}
		if len(p.Joined.Requests) != 22 {
			t.Fatalf("joined %d, want 22", len(p.Joined.Requests))
		}
		for _, j := range p.Joined.Requests {
			if j.Error != nil || j.OutputTokensServer != 8 || j.Server.OutputTokens != 8 || len(j.ChunkNs) == 0 || j.TaskWallNs <= 0 {
				t.Fatalf("joined record %+v", j)
			}
			if j.OutputTokensClient == 0 || j.InputTokens == 0 {
				t.Errorf("client token counts missing: %+v", j.Request)
			}
		}
		// The server's engine steps of the profiling phase: each request's prompt prefilled
		// once and each output token but the first (its prefill's) decoded once.
		want := 0.0
		for _, j := range p.Joined.Requests {
			if j.Phase == records.PhaseProfiling {
				want += float64(j.Server.InputTokens + j.Server.OutputTokens - 1)
			}
		}
		if es := p.Summary.EngineSteps; es == nil || es.Prefill.Steps < 1 || es.Decode.Steps < 1 || es.Prefill.Tokens+es.Decode.Tokens != want {
			t.Errorf("%s: engine steps %+v, want %v tokens", filepath.Base(p.Dir), es, want)
		}
		if p.Summary.Profiling.Requests != 20 || p.Summary.Warmup.Requests != 2 {
			t.Errorf("profiling %d warmup %d", p.Summary.Profiling.Requests, p.Summary.Warmup.Requests)
		}
		if _, ok := p.Summary.Profiling.Stat(reports.TagHTTPMinusTask, "p50"); !ok {
			t.Error("no HTTP − task figure")
		}
		for _, tag := range []string{reports.TagClientUsPerToken, reports.TagFrontendUsPerToken, reports.TagWorkerUsPerToken} {
			if _, ok := p.Summary.Profiling.Stat(tag, "avg"); !ok {
				t.Errorf("no %s figure (serving cost from /proc)", tag)
			}
		}
	}
	// summary.md names the server, URL, model, the bundle's digest (the identity the server
	// logs) and the commit.
	b, err := mqbundle.Open(bundle)
	if err != nil {
		t.Fatal(err)
	}
	digest := b.Digest()
	b.Close()
	if res.BundleDigest != digest {
		t.Errorf("ProfileResult.BundleDigest = %q, want the bundle's digest %s", res.BundleDigest, digest)
	}
	md, _ := os.ReadFile(filepath.Join(res.Points[0].Dir, reports.SummaryMDFile))
	for _, want := range []string{"qual-server (process)", ep.BaseURL, "`" + ep.Model + "`", "bundle_digest `" + digest + "`", "commit "} {
		if !strings.Contains(string(md), want) {
			t.Errorf("summary.md does not name %q:\n%s", want, md)
		}
	}
	// Seeds: each point records the seed it used (the base 9 + its index) and the base, in
	// summary.json and in profile_export_aiperf.json's input_config.
	for i, p := range res.Points {
		if p.Load.Seed != 9+uint64(i) || p.Summary.Seed == nil || p.Summary.Seed.Used != p.Load.Seed || p.Summary.Seed.Base != 9 {
			t.Errorf("%s: ran with seed %d, summary records %+v; want used %d, base 9", filepath.Base(p.Dir), p.Load.Seed, p.Summary.Seed, 9+i)
		}
		var a struct {
			InputConfig struct {
				Input struct {
					Seed uint64 `json:"random_seed"`
					Base uint64 `json:"mq_base_seed"`
				} `json:"input"`
			} `json:"input_config"`
		}
		ab, _ := os.ReadFile(filepath.Join(p.Dir, reports.AIPerfJSONFile))
		if err := json.Unmarshal(ab, &a); err != nil || a.InputConfig.Input.Seed != p.Load.Seed || a.InputConfig.Input.Base != 9 {
			t.Errorf("%s: input_config.input %+v (%v), want random_seed %d, mq_base_seed 9", filepath.Base(p.Dir), a.InputConfig.Input, err, p.Load.Seed)
		}
		// Provenance lives in provenance.json; summary.json refers to it by name and sha256.
		pb, err := os.ReadFile(filepath.Join(p.Dir, load.ProvenanceFile))
		if err != nil {
			t.Fatal(err)
		}
		var prov struct {
			Before, After *provenance.Fingerprints
		}
		if err := json.Unmarshal(pb, &prov); err != nil || prov.Before == nil || prov.After == nil || len(prov.After.Files) == 0 {
			t.Errorf("%s: provenance.json holds %+v (%v), want the fingerprints before and after", filepath.Base(p.Dir), prov, err)
		}
		ps := sha256.Sum256(pb)
		var ref struct {
			File, SHA256 string
			Unchanged    bool
		}
		if err := json.Unmarshal(p.Summary.Provenance, &ref); err != nil || ref.File != load.ProvenanceFile || ref.SHA256 != hex.EncodeToString(ps[:]) || !ref.Unchanged {
			t.Errorf("%s: summary.json provenance = %s, want a reference to provenance.json with its sha256", filepath.Base(p.Dir), p.Summary.Provenance)
		}
		if st, _ := os.Stat(filepath.Join(p.Dir, reports.SummaryJSONFile)); st == nil || st.Size() > 64<<10 {
			t.Errorf("%s: summary.json is %v bytes; the provenance belongs in provenance.json", filepath.Base(p.Dir), st.Size())
		}
	}
	// The sweep's plots are written at its end, beside the run directories.
	if len(res.SweepPlots) != 3 {
		t.Errorf("sweep plots %v, want 3", res.SweepPlots)
	}
	for _, f := range res.SweepPlots {
		if filepath.Dir(f) != filepath.Join(out, "profile"+load.SweepDirSuffix) {
			t.Errorf("sweep plot %s is not in %s", f, filepath.Join(out, "profile"+load.SweepDirSuffix))
		}
		if st, err := os.Stat(f); err != nil || st.Size() == 0 {
			t.Errorf("sweep plot %s: %v", f, err)
		}
	}
	if res.Environment.GoVersion == "" || res.GPU.Available && len(res.GPU.Devices) == 0 {
		t.Errorf("environment %+v gpu %+v", res.Environment, res.GPU)
	}
}

func TestProfileFailsOnMissingServerRecord(t *testing.T) {
	bundle := launchtest.MockBundle(t, 0)
	ep := launchtest.Start(t, bundle, launch.WithFaults("server.drop_record"))
	out := t.TempDir()
	res, err := load.Profile(context.Background(), load.ProfileInput{
		Endpoint:      ep,
		Load:          load.Config{Endpoint: client.Completions, Requests: 10, Prompts: []load.Prompt{{Prompt: "hello"}}, OutputTokens: 2},
		Concurrencies: []int{2},
		OutDir:        out,
		RecordsWait:   time.Second,
	})
	if err == nil || !strings.Contains(err.Error(), "client request IDs without a server record") {
		t.Fatalf("err = %v", err)
	}
	cl, rerr := records.ReadJSONL[records.Request](filepath.Join(res.Points[0].Dir, load.ClientRecordsFile))
	if rerr != nil || len(cl) != 10 {
		t.Fatalf("raw client records must be kept: %d %v", len(cl), rerr)
	}
	// The error names a request ID the client sent.
	named := false
	for _, r := range cl {
		if strings.Contains(err.Error(), r.RequestID) {
			named = true
		}
	}
	if !named {
		t.Errorf("error names no request ID: %v", err)
	}
}

func TestProfileFailsWhenFingerprintedFileChanges(t *testing.T) {
	bundle := launchtest.MockBundle(t, 0)
	ep := launchtest.Start(t, bundle)
	input := filepath.Join(t.TempDir(), "prompts.jsonl")
	os.WriteFile(input, []byte(`{"name":"a","prompt":"hello there"}`+"\n"), 0o644)
	ps, err := load.ReadCorpus(input, nil)
	if err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	res, err := load.Profile(context.Background(), load.ProfileInput{
		Endpoint: ep,
		Load: load.Config{Endpoint: client.Completions, Requests: 6, Prompts: ps, OutputTokens: 2,
			OnPhase: func(phase string, start bool) {
				if phase == records.PhaseProfiling && start {
					os.WriteFile(input, []byte(`{"name":"a","prompt":"edited mid-run"}`+"\n"), 0o644)
				}
			}},
		Concurrencies: []int{2},
		OutDir:        out,
		Fingerprint:   provenance.Spec{Bundle: bundle, Inputs: []string{input}},
	})
	if err == nil || !strings.Contains(err.Error(), "input file "+input+" modified") {
		t.Fatalf("err = %v", err)
	}
	p := res.Points[0]
	if cl, _ := records.ReadJSONL[records.Request](filepath.Join(p.Dir, load.ClientRecordsFile)); len(cl) != 6 {
		t.Errorf("client records kept: %d", len(cl))
	}
	if sv, _ := records.ReadServer(filepath.Join(p.Dir, load.ServerRecordsFile)); len(sv) != 6 {
		t.Errorf("server records kept: %d", len(sv))
	}
	if _, err := os.Stat(filepath.Join(p.Dir, reports.ProfileExportJSONL)); err != nil {
		t.Errorf("exports still written: %v", err)
	}
}

func TestProfileOpenLoopRecordsLateness(t *testing.T) {
	ep := launchtest.Start(t, launchtest.MockBundle(t, 0))
	res, err := load.Profile(context.Background(), load.ProfileInput{
		Endpoint:     ep,
		Load:         load.Config{Endpoint: client.Completions, Stream: true, Requests: 30, Prompts: []load.Prompt{{Prompt: "x"}}, OutputTokens: 4, Arrival: load.ArrivalPoisson, Seed: 3},
		RequestRates: []float64{200},
		OutDir:       t.TempDir(),
	})
	if err != nil {
		t.Fatal(err)
	}
	p := res.Points[0]
	for i, r := range p.Load.Records {
		if r.LatenessNs < 0 || (i > 0 && r.ScheduledNs <= p.Load.Records[i-1].ScheduledNs) {
			t.Fatalf("record %d: scheduled %d lateness %d", i, r.ScheduledNs, r.LatenessNs)
		}
	}
	if _, ok := p.Summary.Profiling.Stat(reports.TagScheduleLateness, "p99"); !ok {
		t.Fatal("lateness missing from the summary")
	}
	var exp map[string]json.RawMessage
	b, _ := os.ReadFile(filepath.Join(p.Dir, reports.AIPerfJSONFile))
	if err := json.Unmarshal(b, &exp); err != nil || exp[reports.TagScheduleLateness] == nil {
		t.Fatalf("aiperf json lacks %s: %v", reports.TagScheduleLateness, err)
	}
	// summary.md says how the schedule was kept, which the lateness figures depend on.
	md, _ := os.ReadFile(filepath.Join(p.Dir, reports.SummaryMDFile))
	if p.Load.Pacer == "" || !strings.Contains(string(md), "Schedule kept by the client's pacer: "+p.Load.Pacer) {
		t.Errorf("summary.md does not name the pacer %q:\n%s", p.Load.Pacer, md)
	}
}

func TestProfileCancellationsStillJoin(t *testing.T) {
	// 5 ms per token and 40 tokens: a 15 ms cancellation lands mid-stream.
	ep := launchtest.Start(t, launchtest.MockBundle(t, 5*time.Millisecond))
	res, err := load.Profile(context.Background(), load.ProfileInput{
		Endpoint: ep,
		Load: load.Config{Endpoint: client.Completions, Stream: true, Requests: 12, Prompts: []load.Prompt{{Prompt: "x"}},
			OutputTokens: 40, CancelRate: 0.5, CancelDelay: 15 * time.Millisecond, Seed: 21},
		Concurrencies: []int{4},
		OutDir:        t.TempDir(),
	})
	if err != nil {
		t.Fatal(err)
	}
	cancelled := 0
	for _, j := range res.Points[0].Joined.Requests {
		if j.Cancelled {
			cancelled++
			if j.Error == nil || j.Error.Code != records.CancelledCode {
				t.Errorf("cancelled request without code 499: %+v", j.Error)
			}
		}
	}
	if cancelled == 0 || cancelled == 12 {
		t.Errorf("cancel rate 0.5 cancelled %d of 12", cancelled)
	}
}

func TestProfileQwen3Tiny(t *testing.T) {
	bundle := launchtest.Bundle(t, "qwen3-tiny")
	ep := launchtest.Start(t, bundle, launch.WithModel("qwen3-tiny"))
	tok, err := tokenizer.Load(launchtest.TokenizerDir(t, "qwen3"))
	if err != nil {
		t.Fatal(err)
	}
	for _, endpoint := range []string{client.Completions, client.Chat} {
		var extra map[string]any
		if endpoint == client.Chat {
			extra = map[string]any{"chat_template_kwargs": map[string]any{"enable_thinking": false}}
		}
		res, err := load.Profile(context.Background(), load.ProfileInput{
			Endpoint: ep,
			Load: load.Config{Endpoint: endpoint, Stream: true, Requests: 4, Warmup: 1, Prompts: synthetic(t, tok, 16),
				OutputTokens: 6, Tokenizer: tok, Extra: extra},
			Concurrencies: []int{2},
			OutDir:        t.TempDir(),
			Name:          endpoint,
		})
		if err != nil {
			t.Fatalf("%s: %v", endpoint, err)
		}
		for _, j := range res.Points[0].Joined.Requests {
			if j.Error != nil || j.OutputTokensServer != 6 {
				t.Fatalf("%s: %+v error %+v", endpoint, j.Request, j.Error)
			}
		}
	}
}

func TestProfileExternalServerHasNoJoin(t *testing.T) {
	srv := launchtest.Start(t, launchtest.MockBundle(t, 0))
	ep, err := launch.External(launch.WithURL(srv.BaseURL), launch.WithModel("mock")).Start(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	res, err := load.Profile(context.Background(), load.ProfileInput{
		Endpoint:      ep,
		Load:          load.Config{Endpoint: client.Completions, Requests: 4, Prompts: []load.Prompt{{Prompt: "hi"}}, OutputTokens: 3},
		Concurrencies: []int{2},
		OutDir:        t.TempDir(),
	})
	if err != nil {
		t.Fatal(err)
	}
	p := res.Points[0]
	if p.Joined != nil || p.Summary.Profiling.Requests != 4 {
		t.Fatalf("external server: joined %v requests %d", p.Joined, p.Summary.Profiling.Requests)
	}
	if _, err := os.Stat(filepath.Join(p.Dir, load.ServerRecordsFile)); !os.IsNotExist(err) {
		t.Errorf("no server records exist for an external server, yet: %v", err)
	}
}

// TestProfileMultiTurnJoinsSessions: a multi-turn run sends each turn's conversation and turn
// (client.HeaderSession, HeaderTurn) and qual-server records them, so every joined request's
// server record names the same session and turn as the client's.
func TestProfileMultiTurnJoinsSessions(t *testing.T) {
	path := filepath.Join(t.TempDir(), "mt.jsonl")
	if err := os.WriteFile(path, []byte(`{"session_id": "conv-a", "turns": [{"text": "first"}, {"text": "second"}, {"text": "third"}]}
{"session_id": "conv-b", "turns": [{"text": "other"}, {"text": "follow-up"}]}
`), 0o644); err != nil {
		t.Fatal(err)
	}
	ds, err := load.ReadDataset(path, load.DatasetMultiTurn, nil)
	if err != nil {
		t.Fatal(err)
	}
	bundle := launchtest.MockBundle(t, 0)
	ep := launchtest.Start(t, bundle)
	res, err := load.Profile(context.Background(), load.ProfileInput{
		Endpoint:      ep,
		Load:          load.Config{Endpoint: client.Completions, Stream: true, Sessions: ds.Sessions, OutputTokens: 4, Seed: 3},
		Concurrencies: []int{2},
		OutDir:        t.TempDir(),
		Fingerprint:   provenance.Spec{Bundle: bundle, TokenizerDir: launchtest.TokenizerDir(t, "gpt2")},
	})
	if err != nil {
		t.Fatal(err)
	}
	joined := res.Points[0].Joined.Requests
	if len(joined) != 5 {
		t.Fatalf("joined %d requests, want 5", len(joined))
	}
	turns := map[string]int{}
	for _, j := range joined {
		if j.ConversationID != "conv-a" && j.ConversationID != "conv-b" {
			t.Errorf("%s: client conversation %q", j.RequestID, j.ConversationID)
		}
		if j.Server.SessionID != j.ConversationID || j.Server.Turn != j.TurnIndex {
			t.Errorf("%s: server recorded session %q turn %d, client sent %q turn %d",
				j.RequestID, j.Server.SessionID, j.Server.Turn, j.ConversationID, j.TurnIndex)
		}
		turns[j.ConversationID]++
	}
	if turns["conv-a"] != 3 || turns["conv-b"] != 2 {
		t.Errorf("turns per session %v, want conv-a 3, conv-b 2", turns)
	}
}
