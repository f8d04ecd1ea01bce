// Command vlcheck is a lab driver (not product) for a vision bundle on the CUDA backend, through
// the product's engine (package native), in one of two modes.
//
// Emulation (-cpu given; run_emu.sh points MODELQUAL_CUDA_LIB at the CPU-emulated
// libmodelqual_cuda.so): the -cuda bundle against the -cpu bundle on the CPU fp32 backend. Per
// case, one image and two images of different grids (each placeholder run with text around it):
//   - the full-vocabulary logits at every prompt position from the first image token on
//     (LogitsImages), max|cuda - cpu| within -tol;
//   - -steps greedy tokens (AddImages, then Step), which must be equal;
//   - the done event's vision_ns: > 0 for an image request on both devices, and 0 for a text
//     request that reuses the slot afterwards (the tower's time is the slot's, cleared on reset).
//
// -faults names MODELQUAL_FAULTS for the cuda engine only (set after the cpu engine opened):
// run_emu.sh runs qwen3vl.shared_image_start, which moves the second image's positions, and
// expects the two-image case to fail.
//
// Golden (-golden given; the GPU host, gpu_check.sh): the -cuda bundle against transformers'
// bf16 outputs on the same GPU (hf_multi.py: one-image and two-image requests with transformers'
// own prompt ids): greedy tokens matched and first-step top-5 max|diff|, a table, pass at
// >= -gate-steps tokens and <= -tol.
//
// A processor whose images keep their own grids (Qwen3-VL) gets the images as a list; one that
// stacks tiles (InternVL) gets one image whose tiles are all the images' tiles.
//
//	vlcheck -cpu CPU_BUNDLE -cuda CUDA_BUNDLE -root . [-steps 8] [-tol 0.1] [-faults F]
//	vlcheck -golden hf.json -cuda CUDA_BUNDLE -root . [-gate-steps 12] [-tol 0.05]
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"math"
	"os"
	"path/filepath"
	"strings"

	"github.com/modelqual/modelqual/native"
	"github.com/modelqual/modelqual/native/bundle"
	"github.com/modelqual/modelqual/server/vision"
)

type engine struct {
	name string
	b    *bundle.Bundle
	e    *native.Engine
}

func open(path, device string) engine {
	b, err := bundle.Open(path)
	if err != nil {
		log.Fatal(err)
	}
	e, err := native.Open(b, native.Params{Threads: 2, MaxBatch: 1, MaxContext: 1024, Device: device})
	if err != nil {
		log.Fatalf("open %s on %s: %v", path, device, err)
	}
	return engine{name: device, b: b, e: e}
}

// generate runs one request to its end and returns its tokens and the done event's timing.
func (g engine) generate(ids []int32, ims []*native.Image, steps int) ([]int32, native.Timing) {
	s := native.Sampling{MaxNewTokens: steps, IgnoreEOS: true}
	var id native.SeqID
	var err error
	if len(ims) == 0 {
		id, err = g.e.Add(ids, s)
	} else {
		id, err = g.e.AddImages(ids, ims, s)
	}
	if err != nil {
		log.Fatalf("%s: add: %v", g.name, err)
	}
	var got []int32
	var tm native.Timing
	for g.e.Active() > 0 {
		if _, err := g.e.Step(func(ev native.Event) {
			if ev.Seq != id {
				return
			}
			if ev.Token >= 0 {
				got = append(got, ev.Token)
			}
			if ev.Done {
				tm = ev.Timing
			}
		}); err != nil {
			log.Fatalf("%s: step: %v", g.name, err)
		}
	}
	return got, tm
}

var failures int

func check(ok bool, format string, a ...any) {
	tag := "ok  "
	if !ok {
		tag = "FAIL"
		failures++
	}
	fmt.Printf("%s %s\n", tag, fmt.Sprintf(format, a...))
}

// visionInput is a bundle's image processor and image token.
type visionInput struct {
	proc   vision.Processor
	stacks bool
	token  int32
}

func newVisionInput(b *bundle.Bundle) visionInput {
	h := b.Header()
	var cfg struct {
		ImageTokenID int32 `json:"image_token_id"`
	}
	if err := json.Unmarshal(h.Config, &cfg); err != nil || cfg.ImageTokenID == 0 {
		log.Fatalf("config.json image_token_id: %v", err)
	}
	pc, err := b.Section(bundle.SectionPreprocessorConfig)
	if err != nil {
		log.Fatal(err)
	}
	proc, err := vision.NewProcessor(pc)
	if err != nil {
		log.Fatal(err)
	}
	if mc, ok := proc.(vision.ModelConfigured); ok {
		if err := mc.UseModelConfig(h.Config); err != nil {
			log.Fatal(err)
		}
	}
	_, stacks := proc.(vision.Stacking)
	return visionInput{proc: proc, stacks: stacks, token: cfg.ImageTokenID}
}

// prepare decodes and preprocesses one image file as the server does.
func (vi visionInput) prepare(root, p string) *vision.Result {
	data, err := os.ReadFile(filepath.Join(root, p))
	if err != nil {
		log.Fatal(err)
	}
	mime := "image/png"
	if strings.HasSuffix(p, ".jpg") {
		mime = "image/jpeg"
	}
	im, err := vision.Decode(data, mime, 1<<26)
	if err != nil {
		log.Fatal(err)
	}
	r, err := vi.proc.Preprocess(im.RGB, im.Width, im.Height)
	if err != nil {
		log.Fatal(err)
	}
	return r
}

// engineImages is the engine's input for rs: a list, or for a stacking processor one image of
// all their tiles.
func (vi visionInput) engineImages(rs []*vision.Result) []*native.Image {
	var ims []*native.Image
	for _, r := range rs {
		ims = append(ims, &native.Image{Pixels: r.Pixels, Grid: r.Grid})
	}
	if !vi.stacks || len(ims) < 2 {
		return ims
	}
	st := &native.Image{Grid: ims[0].Grid}
	st.Grid[0] = 0
	for _, im := range ims {
		st.Pixels = append(st.Pixels, im.Pixels...)
		st.Grid[0] += im.Grid[0]
	}
	return []*native.Image{st}
}

func main() {
	cpuPath := flag.String("cpu", "", "emulation mode: bundle for the cpu backend (fp32)")
	goldenPath := flag.String("golden", "", "golden mode: transformers' outputs (hf_multi.py)")
	cudaPath := flag.String("cuda", "", "bundle for the cuda backend (bf16)")
	root := flag.String("root", ".", "repository root (the images)")
	images := flag.String("images", "fixtures/images/qwen3vl/02-scene-300x200.png,fixtures/images/qwen3vl/04-gray-96x130.png",
		"emulation mode: two images, comma separated; the one-image case takes the first")
	steps := flag.Int("steps", 8, "emulation mode: greedy tokens each request generates (all must match)")
	gate := flag.Int("gate-steps", 12, "golden mode: greedy tokens an entry must match to pass")
	tol := flag.Float64("tol", 0.1, "bound on max|logit diff| (emulation: over the image positions and after; golden: first-step top-5)")
	faults := flag.String("faults", "", "emulation mode: MODELQUAL_FAULTS for the cuda engine only")
	flag.Parse()
	switch {
	case *cpuPath != "" && *goldenPath == "":
		emulation(*cpuPath, *cudaPath, *root, strings.Split(*images, ","), *steps, *tol, *faults)
	case *goldenPath != "" && *cpuPath == "":
		golden(*goldenPath, *cudaPath, *root, *gate, *tol)
	default:
		log.Fatal("vlcheck: pass -cpu (emulation) or -golden (GPU host), not both")
	}
	if failures > 0 {
		fmt.Printf("FAIL (%d failures)\n", failures)
		os.Exit(1)
	}
	fmt.Println("PASS")
}

func emulation(cpuPath, cudaPath, root string, images []string, steps int, tol float64, faults string) {
	cpu := open(cpuPath, "cpu")
	if faults != "" {
		if err := os.Setenv("MODELQUAL_FAULTS", faults); err != nil {
			log.Fatal(err)
		}
	}
	gpu := open(cudaPath, "cuda")
	os.Unsetenv("MODELQUAL_FAULTS")
	defer cpu.e.Close()
	defer gpu.e.Close()
	h := cpu.b.Header()
	fmt.Printf("%s: cpu %s vs cuda %s (faults on cuda: %q)\n", h.Family, h.Provenance.Build.Precision,
		gpu.b.Header().Provenance.Build.Precision, faults)
	vi := newVisionInput(cpu.b)
	var prepared []*vision.Result
	for _, p := range images {
		r := vi.prepare(root, p)
		fmt.Printf("image %s: grid %v, %d tokens\n", p, r.Grid, r.Tokens)
		prepared = append(prepared, r)
	}
	V := cpu.e.Info().VocabSize
	for _, n := range []int{1, 2} {
		// text, image 0, text, image 1, text: every run apart, so each image's positions start
		// after text the layout must count.
		ids := []int32{11, 23, 35}
		for k := 0; k < n; k++ {
			for j := 0; j < prepared[k].Tokens; j++ {
				ids = append(ids, vi.token)
			}
			ids = append(ids, int32(40+k), int32(57+k))
		}
		ids = append(ids, 71, 9)
		ims := vi.engineImages(prepared[:n])
		what := fmt.Sprintf("%d image(s), %d prompt tokens", n, len(ids))
		lc, err := cpu.e.LogitsImages(ids, ims)
		if err != nil {
			log.Fatalf("cpu logits: %v", err)
		}
		lg, err := gpu.e.LogitsImages(ids, ims)
		if err != nil {
			log.Fatalf("cuda logits: %v", err)
		}
		worst, at, last := 0.0, 0, 0.0
		for pos := 3; pos < len(ids); pos++ {
			for v := 0; v < V; v++ {
				d := math.Abs(float64(lc[pos*V+v]) - float64(lg[pos*V+v]))
				if d > worst {
					worst, at = d, pos
				}
				if pos == len(ids)-1 {
					last = math.Max(last, d)
				}
			}
		}
		check(worst <= tol, "%s: logits max|cuda-cpu| %.4g (at position %d; last position %.4g), bound %g", what, worst, at, last, tol)
		tc, tmc := cpu.generate(ids, ims, steps)
		tg, tmg := gpu.generate(ids, ims, steps)
		match := 0
		for match < len(tc) && match < len(tg) && tc[match] == tg[match] {
			match++
		}
		check(match == steps, "%s: greedy %d of %d tokens equal (cpu %v, cuda %v)", what, match, steps, tc, tg)
		check(tmc.VisionNs > 0 && tmg.VisionNs > 0, "%s: vision_ns cpu %d, cuda %d (both > 0)", what, tmc.VisionNs, tmg.VisionNs)
		_, tt := gpu.generate([]int32{11, 23, 35, 71, 9}, nil, 2)
		check(tt.VisionNs == 0, "text request after it on cuda: vision_ns %d (want 0)", tt.VisionNs)
	}
}

type goldenFile struct {
	Family, Dtype, Device string
	Entries               []struct {
		Name      string   `json:"name"`
		Images    []string `json:"images"`
		PromptIDs []int32  `json:"prompt_ids"`
		GreedyIDs []int32  `json:"greedy_ids"`
		Steps     []struct {
			Top5IDs    []int32   `json:"top5_ids"`
			Top5Logits []float64 `json:"top5_logits"`
		} `json:"steps"`
	} `json:"entries"`
}

func golden(goldenPath, cudaPath, root string, gate int, tol float64) {
	raw, err := os.ReadFile(goldenPath)
	if err != nil {
		log.Fatal(err)
	}
	var g goldenFile
	if err := json.Unmarshal(raw, &g); err != nil {
		log.Fatal(err)
	}
	gpu := open(cudaPath, "cuda")
	defer gpu.e.Close()
	vi := newVisionInput(gpu.b)
	V := gpu.e.Info().VocabSize
	fmt.Printf("%s on cuda (%s) vs transformers %s on %s\n", gpu.b.Header().Family, gpu.b.Header().Provenance.Build.Precision, g.Dtype, g.Device)
	fmt.Printf("%-28s %-7s %-7s %-9s %-12s %s\n", "request", "images", "match", "max|diff|", "vision_ms", "pass")
	for _, e := range g.Entries {
		var rs []*vision.Result
		for _, p := range e.Images {
			rs = append(rs, vi.prepare(root, p))
		}
		ims := vi.engineImages(rs)
		got, tm := gpu.generate(e.PromptIDs, ims, len(e.GreedyIDs))
		match := 0
		for match < len(got) && match < len(e.GreedyIDs) && got[match] == e.GreedyIDs[match] {
			match++
		}
		lg, err := gpu.e.LogitsImages(e.PromptIDs, ims)
		if err != nil {
			log.Fatalf("%s: logits: %v", e.Name, err)
		}
		worst, pos := 0.0, len(e.PromptIDs)-1
		for j, tok := range e.Steps[0].Top5IDs {
			worst = math.Max(worst, math.Abs(float64(lg[pos*V+int(tok)])-e.Steps[0].Top5Logits[j]))
		}
		ok := match >= min(gate, len(e.GreedyIDs)) && worst <= tol && tm.VisionNs > 0
		fmt.Printf("%-28s %-7d %-7s %-9.4f %-12.3f %v\n", e.Name, len(e.Images), fmt.Sprintf("%d/%d", match, len(e.GreedyIDs)), worst,
			float64(tm.VisionNs)/1e6, ok)
		if !ok {
			failures++
		}
	}
}
