package load

import (
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/modelqual/modelqual/qual/records"
)

func TestReadImageRequestsNeedsEveryControl(t *testing.T) {
	dir := t.TempDir()
	ok := filepath.Join(dir, "ok.jsonl")
	os.WriteFile(ok, []byte(`{"prompt": "a fox", "size": "64x64", "num_inference_steps": 4, "guidance_scale": 0, "seed": 0}`+"\n"), 0o644)
	reqs, err := ReadImageRequests(ok)
	if err != nil || len(reqs) != 1 || *reqs[0].Steps != 4 || *reqs[0].Guidance != 0 || *reqs[0].Seed != 0 {
		t.Fatalf("%+v %v", reqs, err)
	}
	for field, line := range map[string]string{
		"seed":                `{"prompt": "a fox", "size": "64x64", "num_inference_steps": 4, "guidance_scale": 1}`,
		"guidance_scale":      `{"prompt": "a fox", "size": "64x64", "num_inference_steps": 4, "seed": 1}`,
		"num_inference_steps": `{"prompt": "a fox", "size": "64x64", "guidance_scale": 1, "seed": 1}`,
		"size":                `{"prompt": "a fox", "num_inference_steps": 4, "guidance_scale": 1, "seed": 1}`,
		"quality":             `{"prompt": "a fox", "size": "64x64", "num_inference_steps": 4, "guidance_scale": 1, "seed": 1, "quality": "hd"}`,
	} {
		p := filepath.Join(dir, field+".jsonl")
		os.WriteFile(p, []byte(line+"\n"), 0o644)
		if _, err := ReadImageRequests(p); err == nil || !strings.Contains(err.Error(), field) {
			t.Errorf("missing or unknown %s: error %v, want one naming it", field, err)
		}
	}
}

func TestDistPercentiles(t *testing.T) {
	d := dist([]float64{4, 1, 3, 2, 5})
	// numpy.percentile([1,2,3,4,5], [50, 90, 95, 99]) = 3, 4.6, 4.8, 4.96
	if d.P50 != 3 || math.Abs(d.P90-4.6) > 1e-12 || math.Abs(d.P95-4.8) > 1e-12 || math.Abs(d.P99-4.96) > 1e-12 || d.Avg != 3 || d.N != 5 {
		t.Errorf("%+v", d)
	}
}

// TestImageExportFromRecords: an image request's export line is its client record's figures
// (METRICS.md): request latency = end of the body − send, image latency = latency / images,
// image throughput = images / latency in seconds, the PNG's bytes, the timestamps made
// absolute; a request that returned no image exports its error's code and type and no figure;
// the server's record adds the task wall time and HTTP − task.
func TestImageExportFromRecords(t *testing.T) {
	ok := imageClientRecord{RequestID: "p-m-0", Phase: records.PhaseProfiling, StartUnixNs: 1_000, AckNs: 40_000_000, EndNs: 50_000_000,
		HTTPStatus: 200, NumImages: 1, PNGBytes: 1234}
	bad := imageClientRecord{RequestID: "p-w-0", Phase: records.PhaseWarmup, StartUnixNs: 2_000, EndNs: 7_000_000, HTTPStatus: 503}
	bad.fail(503, "http_error", "busy")
	server := map[string]records.Server{"p-m-0": {TaskWallNs: 30_000_000}}
	exp := imageExport([]imageClientRecord{ok, bad}, server)
	if len(exp) != 2 {
		t.Fatalf("%d export lines, want 2", len(exp))
	}
	e := exp[0]
	if e.Metadata.RequestStartNs != 1_000 || e.Metadata.RequestAckNs != 40_001_000 || e.Metadata.RequestEndNs != 50_001_000 ||
		e.Metadata.BenchmarkPhase != "profiling" || e.Error != nil {
		t.Errorf("measured line: %+v, error %+v", e.Metadata, e.Error)
	}
	for tag, want := range map[string]float64{"request_latency": 50, "image_latency": 50, "image_throughput": 20, "num_images": 1,
		"mq_png_bytes": 1234, "mq_task_wall_time": 30, "mq_http_minus_task": 20} {
		if got, has := e.Value(tag); !has || math.Abs(got-want) > 1e-9 {
			t.Errorf("%s = %v (present %v), want %v", tag, got, has, want)
		}
	}
	f := exp[1]
	if f.Metadata.BenchmarkPhase != "warmup" || f.Error == nil || f.Error.Code != 503 || f.Error.Type != "http_error" || len(f.Metrics) != 0 {
		t.Errorf("failed line: phase %s, error %+v, metrics %v", f.Metadata.BenchmarkPhase, f.Error, f.Metrics)
	}
}
