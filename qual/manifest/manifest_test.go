package manifest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelqual/modelqual/native/bundle"
)

func TestLoadValidManifest(t *testing.T) {
	m, err := Load("testdata/manifest.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if m.Family != "qwen" || m.NativeFamily != "qwen3" || m.Checkpoint.Fixture != "qwen3-tiny" || m.Server.Workers != 2 {
		t.Fatalf("manifest = %+v", m)
	}
	if m.Server.StartupTimeout.Duration != 2*time.Minute || m.Server.RequestTimeout.Duration != time.Minute {
		t.Fatalf("server timeouts = %+v", m.Server)
	}
	p, ok := m.Profile("open-loop")
	if !ok || p.Duration.Duration != 30*time.Second || len(p.RequestRate) != 2 || p.RequestRate[0] != 2.5 || p.MaxConcurrency != 16 {
		t.Fatalf("open-loop profile = %+v", p)
	}
	if c, _ := m.Profile("chat-sweep"); !c.Premerge || !c.Stream || c.SLO["ttft_p99"] != "500ms" || len(c.Concurrency) != 3 {
		t.Fatalf("chat-sweep profile = %+v", c)
	}
	want := bundle.Expect{Family: "qwen3", CheckpointID: "modelqual-fixtures/qwen3-tiny", Revision: "67f91033e7f503cf75cfc86cf71ea47cd458172a",
		Precision: "fp32", Backend: "cpu", MaxContext: 2048}
	if m.Expect() != want {
		t.Fatalf("Expect() = %+v, want %+v", m.Expect(), want)
	}
	if m.Path() != "testdata/manifest.yaml" {
		t.Fatalf("Path() = %q", m.Path())
	}
}

// TestValidateNamesTheField mutates one field of a valid manifest at a time; the error must
// name the manifest file and exactly that field.
func TestValidateNamesTheField(t *testing.T) {
	cases := []struct {
		field string
		mut   func(m *Manifest)
	}{
		{"family", func(m *Manifest) { m.Family = "Qwen!" }},
		{"native_family", func(m *Manifest) { m.NativeFamily = "Llama 3" }},
		{"owner", func(m *Manifest) { m.Owner = " " }},
		{"tasks", func(m *Manifest) { m.Tasks = nil }},
		{"tasks[1]", func(m *Manifest) { m.Tasks[1] = "audio" }},
		{"checkpoint.id", func(m *Manifest) { m.Checkpoint.ID = "qwen3" }},
		{"checkpoint.revision", func(m *Manifest) { m.Checkpoint.Revision = "main" }},
		{"build.precision", func(m *Manifest) { m.Build.Precision = "int8" }},
		{"build.precision", func(m *Manifest) { m.Build.Precision = "bf16" }}, // on cpu
		{"build.backend", func(m *Manifest) { m.Build.Backend = "tpu" }},
		{"build.max_context", func(m *Manifest) { m.Build.MaxContext = -1 }},
		{"build.max_batch", func(m *Manifest) { m.Build.MaxBatch = -1 }},
		{"server.workers", func(m *Manifest) { m.Server.Workers = 0 }},
		{"server.startup_timeout", func(m *Manifest) { m.Server.StartupTimeout.Duration = 0 }},
		{"server.request_timeout", func(m *Manifest) { m.Server.RequestTimeout.Duration = -time.Second }},
		{"profiles[1].name", func(m *Manifest) { m.Profiles[1].Name = m.Profiles[0].Name }},
		{"profiles[0].endpoint", func(m *Manifest) { m.Profiles[0].Endpoint = "embeddings" }},
		{"profiles[0].endpoint", func(m *Manifest) { m.Tasks = []string{"text"} }}, // chat profile without the chat task
		{"profiles[0].concurrency", func(m *Manifest) { m.Profiles[0].RequestRate = []float64{1} }},
		{"profiles[1].concurrency", func(m *Manifest) { m.Profiles[1].RequestRate = nil }},
		{"profiles[0].concurrency[2]", func(m *Manifest) { m.Profiles[0].Concurrency[2] = 0 }},
		{"profiles[1].request_rate[0]", func(m *Manifest) { m.Profiles[1].RequestRate[0] = 0 }},
		{"profiles[1].requests", func(m *Manifest) { m.Profiles[1].Duration.Duration = 0 }},
		{"profiles[0].warmup", func(m *Manifest) { m.Profiles[0].Warmup = -1 }},
		{"profiles[0].input_tokens_mean", func(m *Manifest) { m.Profiles[0].InputTokensMean = 0 }},
		{"profiles[0].input_tokens_stddev", func(m *Manifest) { m.Profiles[0].InputTokensStddev = -2 }},
		{"profiles[1].output_tokens", func(m *Manifest) { m.Profiles[1].OutputTokens = 0 }},
		{"profiles[1].output_tokens_stddev", func(m *Manifest) { m.Profiles[1].OutputTokensStddev = -1 }},
		{"profiles[0].slo.ttft_p99", func(m *Manifest) { m.Profiles[0].SLO["ttft_p99"] = "fast" }},
	}
	for _, c := range cases {
		m, err := Load("testdata/manifest.yaml")
		if err != nil {
			t.Fatal(err)
		}
		c.mut(m)
		err = m.Validate()
		if err == nil || !strings.Contains(err.Error(), "manifest testdata/manifest.yaml: "+c.field+" ") {
			t.Errorf("%s: Validate() = %v", c.field, err)
		}
	}
}

func TestLoadRejectsTyposAndBadDurations(t *testing.T) {
	good, _ := os.ReadFile("testdata/manifest.yaml")
	for _, c := range []struct{ name, from, to, want string }{
		{"unknown field", "max_context:", "max_contxt:", `unknown field "max_contxt"`},
		{"bad duration", "startup_timeout: 120s", "startup_timeout: soon", `duration "soon"`},
		{"numeric duration", "request_timeout: 60s", "request_timeout: 60", `not a string like "30s"`},
		{"branch revision", "revision: 67f91033e7f503cf75cfc86cf71ea47cd458172a", "revision: main", `checkpoint.revision "main" is not immutable`},
	} {
		p := filepath.Join(t.TempDir(), "manifest.yaml")
		os.WriteFile(p, []byte(strings.Replace(string(good), c.from, c.to, 1)), 0o644)
		_, err := Load(p)
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), p) {
			t.Errorf("%s: Load = %v, want it to name %s and %q", c.name, err, p, c.want)
		}
	}
	if _, err := Load("testdata/none.yaml"); err == nil {
		t.Error("Load of a missing file succeeded")
	}
}

func TestThresholds(t *testing.T) {
	th, err := LoadThresholds("testdata/thresholds.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if th.MaxAbsLogitDiff != 1e-3 || th.GreedySteps != 32 || th.CorpusMinPass != 12 || th.GPU == nil || th.GPU.MaxAbsLogitDiff != 0.05 {
		t.Fatalf("thresholds = %+v gpu %+v", th, th.GPU)
	}
	for _, c := range []struct {
		mut  func(*Thresholds)
		want string
	}{
		{func(t *Thresholds) { t.MaxAbsLogitDiff = 0 }, "max_abs_logit_diff"},
		{func(t *Thresholds) { t.GreedySteps = 0 }, "greedy_steps"},
		{func(t *Thresholds) { t.CorpusMinPass = -1 }, "corpus_min_pass"},
		{func(t *Thresholds) { t.GPU.GreedySteps = 0 }, "gpu.greedy_steps"},
		{func(t *Thresholds) { t.GPU.GPU = &Thresholds{} }, "gpu.gpu must not nest"},
		{func(t *Thresholds) { t.GPU.Precision = "int8" }, "gpu.precision \"int8\""},
		{func(t *Thresholds) { t.Precision = "fp32" }, "precision belongs in the gpu: block"},
	} {
		cp := *th
		gpu := *th.GPU
		cp.GPU = &gpu
		c.mut(&cp)
		if err := cp.Validate(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Validate() = %v, want %q", err, c.want)
		}
	}
	p := filepath.Join(t.TempDir(), "t.yaml")
	os.WriteFile(p, []byte("max_abs_logit_diff: 1e-3\ngreedy_steps: 32\ncorpus_min_pas: 3\n"), 0o644)
	if _, err := LoadThresholds(p); err == nil || !strings.Contains(err.Error(), "corpus_min_pas") {
		t.Errorf("typo accepted: %v", err)
	}
}

// TestImageThresholds: a text-to-image family's thresholds carry psnr_min_db, ssim_min and
// max_abs_latent_diff instead of the logits fields, and each bad value names its field.
func TestImageThresholds(t *testing.T) {
	p := filepath.Join(t.TempDir(), "t.yaml")
	os.WriteFile(p, []byte("psnr_min_db: 40\nssim_min: 0.99\nmax_abs_latent_diff: 1.0e-4\ncorpus_min_pass: 0\n"), 0o644)
	th, err := LoadThresholds(p)
	if err != nil {
		t.Fatal(err)
	}
	if !th.Image() || th.PSNRMinDB != 40 || th.SSIMMin != 0.99 || th.MaxAbsLatentDiff != 1e-4 {
		t.Fatalf("thresholds = %+v", th)
	}
	for _, c := range []struct {
		mut  func(*Thresholds)
		want string
	}{
		{func(t *Thresholds) { t.PSNRMinDB = 0 }, "psnr_min_db"},
		{func(t *Thresholds) { t.SSIMMin = 1.5 }, "ssim_min"},
		{func(t *Thresholds) { t.MaxAbsLatentDiff = -1 }, "max_abs_latent_diff"},
		{func(t *Thresholds) { t.GreedySteps = 3 }, "max_abs_logit_diff"}, // half a text block
	} {
		cp := *th
		c.mut(&cp)
		if err := cp.Validate(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Validate() = %v, want %q", err, c.want)
		}
	}
}

// TestImageProfile: endpoint images needs the image task and an input_file next to the
// manifest, and takes no token lengths or streaming.
func TestImageProfile(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "images.jsonl"), []byte(`{"prompt": "a", "size": "64x64", "num_inference_steps": 2, "guidance_scale": 0, "seed": 1}`+"\n"), 0o644)
	mk := func(edit func(string) string) (*Manifest, error) {
		y := `family: zimage
native_family: zimage
owner: o
tasks: [image]
checkpoint: {id: org/zimage-tiny, revision: 3c69c6436b82e02bf92f54216e6249b3dfe90910}
build: {precision: fp32, backend: cpu}
server: {workers: 1, startup_timeout: 60s, request_timeout: 60s}
profiles:
  - name: images-closed
    endpoint: images
    input_file: images.jsonl
    concurrency: [1]
    requests: 4
    warmup: 1
`
		p := filepath.Join(dir, "manifest.yaml")
		os.WriteFile(p, []byte(edit(y)), 0o644)
		return Load(p)
	}
	m, err := mk(func(s string) string { return s })
	if err != nil {
		t.Fatal(err)
	}
	if got := m.InputPath(m.Profiles[0]); got != filepath.Join(dir, "images.jsonl") {
		t.Errorf("InputPath = %s", got)
	}
	for _, c := range []struct{ from, to, want string }{
		{"    input_file: images.jsonl\n", "", "profiles[0].input_file is required"},
		{"input_file: images.jsonl", "input_file: none.jsonl", "profiles[0].input_file \"none.jsonl\" is not a file"},
		{"tasks: [image]", "tasks: [text]", "profiles[0].endpoint is images but tasks"},
		{"    warmup: 1\n", "    warmup: 1\n    output_tokens: 16\n", "images takes neither stream nor token lengths"},
	} {
		if _, err := mk(func(s string) string { return strings.Replace(s, c.from, c.to, 1) }); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q -> %q: %v, want %q", c.from, c.to, err, c.want)
		}
	}
}

// TestChatProfileImages: a chat profile of a vision family may carry images, synthetic or from a
// folder next to the manifest; every wrong setting names its field.
func TestChatProfileImages(t *testing.T) {
	dir := t.TempDir()
	os.Mkdir(filepath.Join(dir, "corpus"), 0o755)
	mk := func(edit func(string) string) (*Manifest, error) {
		y := `family: vl
native_family: qwen3vl
owner: o
tasks: [chat, vision]
checkpoint: {id: org/vl-tiny, revision: 3c69c6436b82e02bf92f54216e6249b3dfe90910}
build: {precision: fp32, backend: cpu}
server: {workers: 1, startup_timeout: 60s, request_timeout: 60s}
profiles:
  - name: chat-images
    endpoint: chat
    stream: true
    concurrency: [1]
    requests: 4
    warmup: 1
    input_tokens_mean: 8
    output_tokens: 4
    images: {width_mean: 64, height_mean: 48, per_request: 2}
`
		p := filepath.Join(dir, "manifest.yaml")
		os.WriteFile(p, []byte(edit(y)), 0o644)
		return Load(p)
	}
	m, err := mk(func(s string) string { return s })
	if err != nil {
		t.Fatal(err)
	}
	if im := m.Profiles[0].Images; im == nil || im.WidthMean != 64 || im.PerRequest != 2 {
		t.Fatalf("images = %+v", im)
	}
	m, err = mk(func(s string) string { return strings.Replace(s, "width_mean: 64, height_mean: 48", "dir: corpus", 1) })
	if err != nil || m.ImageDir(m.Profiles[0]) != filepath.Join(dir, "corpus") {
		t.Fatalf("dir corpus: %v, ImageDir %q", err, m.ImageDir(m.Profiles[0]))
	}
	for _, c := range []struct{ from, to, want string }{
		{"tasks: [chat, vision]", "tasks: [chat]", "profiles[0].images applies to endpoint chat of a family whose tasks include \"vision\""},
		{"width_mean: 64, height_mean: 48", "width_mean: 64", "profiles[0].images.width_mean"},
		{"width_mean: 64, height_mean: 48", "dir: corpus, width_mean: 64, height_mean: 48", "set either dir or width_mean"},
		{"width_mean: 64, height_mean: 48", "dir: nowhere", "profiles[0].images.dir \"nowhere\" is not a folder"},
		{"per_request: 2", "per_request: -1", "profiles[0].images.per_request"},
		{"per_request: 2", "fraction: 1.5", "profiles[0].images.fraction"},
		{"per_request: 2", "format: gif", "profiles[0].images.format"},
		{"per_request: 2", "count: 2", "count"},
	} {
		if _, err := mk(func(s string) string { return strings.Replace(s, c.from, c.to, 1) }); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q -> %q: %v, want %q", c.from, c.to, err, c.want)
		}
	}
}
