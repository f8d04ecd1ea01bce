package load

import (
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
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
