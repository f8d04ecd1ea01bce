package load_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/modelqual/modelqual/qual/launch"
	"github.com/modelqual/modelqual/qual/launch/launchtest"
	"github.com/modelqual/modelqual/qual/load"
	"github.com/modelqual/modelqual/qual/provenance"
	"github.com/modelqual/modelqual/qual/recount"
	"github.com/modelqual/modelqual/reports"
)

// imageRequestsFile writes two image requests (the zimage-tiny fixture's sizes) as JSONL.
func imageRequestsFile(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "images.jsonl")
	lines := `{"prompt": "a red fox in the snow", "size": "64x64", "num_inference_steps": 2, "guidance_scale": 3.5, "seed": 42}
{"prompt": "a lighthouse at dusk", "size": "64x64", "num_inference_steps": 2, "guidance_scale": 0, "seed": 7}
`
	if err := os.WriteFile(p, []byte(lines), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// aiperfObject reads a run directory's profile_export_aiperf.json, which must be one object
// (AIPerf's layout), not a list.
func aiperfObject(t *testing.T, dir string) map[string]json.RawMessage {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, reports.AIPerfJSONFile))
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("%s is not AIPerf's object: %v", filepath.Join(dir, reports.AIPerfJSONFile), err)
	}
	return m
}

// TestProfileImagesWritesTheTextLayout: an image profile through Profile writes what a text
// profile writes, per point (exports, AIPerf's object with its image metrics, CSV, summaries,
// plots, records, provenance) and the sweep plots; the server's records are joined (task wall
// time present), and the same server given by URL, whose records are not readable, is
// profiled client-side only with the note saying so.
func TestProfileImagesWritesTheTextLayout(t *testing.T) {
	bundle := launchtest.Bundle(t, "zimage-tiny")
	ep := launchtest.Start(t, bundle)
	input := imageRequestsFile(t)
	out := t.TempDir()
	res, err := load.Profile(context.Background(), load.ProfileInput{
		Endpoint:      ep,
		Load:          load.Config{Endpoint: load.EndpointImages, Requests: 3, Warmup: 1, Seed: 5},
		Concurrencies: []int{1, 2},
		OutDir:        out,
		Fingerprint:   provenance.Spec{Bundle: bundle, Inputs: []string{input}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Points) != 2 || len(res.SweepPlots) != 3 {
		t.Fatalf("%d points, sweep plots %v; want 2 points and 3 plots", len(res.Points), res.SweepPlots)
	}
	for i, p := range res.Points {
		for _, f := range []string{reports.ProfileExportJSONL, reports.AIPerfJSONFile, reports.AIPerfCSVFile, reports.SummaryJSONFile,
			reports.SummaryMDFile, reports.LatencyCDFPNG, load.ClientRecordsFile, load.ServerRecordsFile, load.ProvenanceFile, load.EnvironmentFile} {
			if st, err := os.Stat(filepath.Join(p.Dir, f)); err != nil || st.Size() == 0 {
				t.Errorf("%s: %s missing or empty (%v)", filepath.Base(p.Dir), f, err)
			}
		}
		m := aiperfObject(t, p.Dir)
		for _, tag := range []string{reports.TagRequestLatency, reports.TagNumImages, reports.TagImageThroughput, reports.TagImageLatency,
			reports.TagRequestThroughput, reports.TagTaskWallTime, reports.TagPNGEncode, "input_config"} {
			if _, ok := m[tag]; !ok {
				t.Errorf("%s: profile_export_aiperf.json lacks %s", filepath.Base(p.Dir), tag)
			}
		}
		if _, ok := m[reports.TagOutputTokenThroughput]; ok {
			t.Errorf("%s: an image run reports an output token throughput", filepath.Base(p.Dir))
		}
		s := p.Summary
		if s.Profiling.Requests != 3 || s.Warmup.Requests != 1 {
			t.Errorf("%s: %d measured and %d warmup requests, want 3 and 1", filepath.Base(p.Dir), s.Profiling.Requests, s.Warmup.Requests)
		}
		if s.Seed == nil || s.Seed.Base != 5 || s.Seed.Used != 5+uint64(i) {
			t.Errorf("%s: seed %+v, want base 5, used %d", filepath.Base(p.Dir), s.Seed, 5+i)
		}
		if s.Target == nil || s.Target.BundleDigest == "" || s.Target.BundleDigest != res.BundleDigest {
			t.Errorf("%s: target %+v lacks the bundle digest %s", filepath.Base(p.Dir), s.Target, res.BundleDigest)
		}
		// Every figure the point reports is recomputed apart from the raw records.
		if rep, err := recount.Verify(p.Dir); err != nil || rep.Err() != nil || rep.Layout != "text (images)" {
			t.Errorf("%s: recount: layout %q, %v, %v", filepath.Base(p.Dir), rep.Layout, err, rep.Err())
		}
	}

	// The same server by URL: no records to read, so client-side metrics only, noted (and
	// still recomputed, the server figures apart).
	byURL := &launch.Endpoint{BaseURL: ep.BaseURL, Model: ep.Model, Kind: "external"}
	out2 := t.TempDir()
	res2, err := load.Profile(context.Background(), load.ProfileInput{
		Endpoint:      byURL,
		Load:          load.Config{Endpoint: load.EndpointImages, Requests: 2, Warmup: 1},
		Concurrencies: []int{1},
		OutDir:        out2,
		Fingerprint:   provenance.Spec{Inputs: []string{input}},
	})
	if err != nil {
		t.Fatalf("image profile by URL: %v", err)
	}
	if len(res2.Notes) != 1 || res2.Notes[0] != load.NoServerRecordsNote {
		t.Errorf("notes %q, want the no-server-records note", res2.Notes)
	}
	dir := res2.Points[0].Dir
	m := aiperfObject(t, dir)
	if _, ok := m[reports.TagImageThroughput]; !ok {
		t.Error("by URL: profile_export_aiperf.json lacks image_throughput")
	}
	if _, ok := m[reports.TagTaskWallTime]; ok {
		t.Error("by URL: a task wall time without server records")
	}
	if rep, err := recount.Verify(dir); err != nil || rep.Err() != nil {
		t.Errorf("by URL: recount: %v, %v", err, rep.Err())
	}
	md, _ := os.ReadFile(filepath.Join(dir, reports.SummaryMDFile))
	if !strings.Contains(string(md), "client-side metrics only") {
		t.Errorf("summary.md does not say the run is client-side only:\n%s", md)
	}
}
