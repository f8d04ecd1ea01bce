// Command vlbench is a lab driver (not product): it runs the qwen3vl image corpus through the
// native engine (native.Engine.AddImage / LogitsImage, --device cuda on the GPU host) against a
// golden file that transformers made on the same machine (lab/cuda/qwen3vl_hf.py, bf16 on the
// GPU), and prints the parity table (greedy tokens matched, first-step top-5 logits max|diff|)
// and, image by image, the engine's time to first token and output tokens/s beside the
// transformers timings the golden carries, as ratios.
//
//	vlbench -bundle DIR -snapshot DIR -golden hf.json -root . -device cuda [-steps 32] [-reps 3]
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/modelqual/modelqual/native"
	"github.com/modelqual/modelqual/native/bundle"
	"github.com/modelqual/modelqual/server/vision"
)

type step struct {
	Top5IDs    []int32   `json:"top5_ids"`
	Top5Logits []float64 `json:"top5_logits"`
}

type entry struct {
	Name      string  `json:"name"`
	Image     string  `json:"image"`
	RGBSource string  `json:"rgb_source"` // the file transformers read (a Pillow-decoded PNG for a JPEG)
	Width     int     `json:"width"`
	Height    int     `json:"height"`
	Grid      []int   `json:"grid_thw"`
	PromptIDs []int32 `json:"prompt_ids"`
	GreedyIDs []int32 `json:"greedy_ids"`
	Steps     []step  `json:"steps"`
	TTFTms    float64 `json:"ttft_ms"`       // transformers: generate(max_new_tokens=1), median
	TokPerS   float64 `json:"out_tok_per_s"` // transformers: (n-1) / (t_n - t_1)
}

type golden struct {
	Fixture string  `json:"fixture"`
	Dtype   string  `json:"dtype"`
	Device  string  `json:"device"`
	Entries []entry `json:"entries"`
}

func main() {
	bpath := flag.String("bundle", "", "bundle directory")
	snap := flag.String("snapshot", "", "checkpoint snapshot (preprocessor_config.json)")
	gpath := flag.String("golden", "", "golden JSON from lab/cuda/qwen3vl_hf.py")
	root := flag.String("root", ".", "repository root")
	device := flag.String("device", "cuda", "cpu or cuda")
	reps := flag.Int("reps", 3, "timed runs per image (median)")
	greedyGate := flag.Int("gate-steps", 16, "greedy steps an image must match to pass (thresholds.yaml gpu.greedy_steps)")
	tol := flag.Float64("tol", 0.05, "first-step logits bound (thresholds.yaml gpu.max_abs_logit_diff)")
	outPath := flag.String("out", "", "write the table and figures here as JSON too")
	flag.Parse()
	raw, err := os.ReadFile(*gpath)
	if err != nil {
		log.Fatal(err)
	}
	var g golden
	if err := json.Unmarshal(raw, &g); err != nil {
		log.Fatal(err)
	}
	pc, err := os.ReadFile(filepath.Join(*snap, "preprocessor_config.json"))
	if err != nil {
		log.Fatal(err)
	}
	cfg, err := vision.ParseConfig(pc)
	if err != nil {
		log.Fatal(err)
	}
	b, err := bundle.Open(*bpath)
	if err != nil {
		log.Fatal(err)
	}
	defer b.Close()
	e, err := native.Open(b, native.Params{Threads: 2, MaxBatch: 2, MaxContext: 4096, Device: *device})
	if err != nil {
		log.Fatal(err)
	}
	defer e.Close()
	V := e.Info().VocabSize

	// run generates n tokens for one image; it returns them, the time to the first and the
	// time from the first to the last.
	run := func(ids []int32, im *native.Image, n int) ([]int32, time.Duration, time.Duration) {
		t0 := time.Now()
		id, err := e.AddImage(ids, im, native.Sampling{MaxNewTokens: n, IgnoreEOS: true})
		if err != nil {
			log.Fatal(err)
		}
		var got []int32
		var t1, tn time.Time
		for e.Active() > 0 {
			if _, err := e.Step(func(ev native.Event) {
				if ev.Seq == id && ev.Token >= 0 {
					now := time.Now()
					if len(got) == 0 {
						t1 = now
					}
					tn = now
					got = append(got, ev.Token)
				}
			}); err != nil {
				log.Fatal(err)
			}
		}
		return got, t1.Sub(t0), tn.Sub(t1)
	}
	median := func(v []float64) float64 { sort.Float64s(v); return v[len(v)/2] }

	type row struct {
		Name                 string
		Size, Grid           string
		Tokens, Match        int
		Pass                 bool
		MaxDiff              float64
		TTFTms, TokS         float64
		HFTTFTms, HFTokS     float64
		TTFTRatio, TokSRatio float64
	}
	var rows []row
	pass := 0
	for i, ge := range g.Entries {
		path := ge.RGBSource
		if !filepath.IsAbs(path) {
			path = filepath.Join(*root, path)
		}
		data, err := os.ReadFile(path)
		if err != nil {
			log.Fatal(err)
		}
		src := ge.RGBSource
		mime := "image/png"
		if strings.HasSuffix(src, ".jpg") {
			mime = "image/jpeg"
		}
		im, err := vision.Decode(data, mime, 1<<26)
		if err != nil {
			log.Fatal(err)
		}
		r, err := cfg.Preprocess(im.RGB, im.Width, im.Height)
		if err != nil {
			log.Fatal(err)
		}
		img := &native.Image{Pixels: r.Pixels, Grid: r.Grid}
		steps := len(ge.GreedyIDs)
		if i == 0 { // warm-up: first-use costs (module loads, cuBLAS heuristics) stay out of the figures
			run(ge.PromptIDs, img, steps)
		}
		got, _, _ := run(ge.PromptIDs, img, steps)
		match := 0
		for match < len(got) && match < steps && got[match] == ge.GreedyIDs[match] {
			match++
		}
		lg, err := e.LogitsImage(ge.PromptIDs, img)
		if err != nil {
			log.Fatal(err)
		}
		worst := 0.0
		pos := len(ge.PromptIDs) - 1
		for j, tok := range ge.Steps[0].Top5IDs {
			worst = math.Max(worst, math.Abs(float64(lg[pos*V+int(tok)])-ge.Steps[0].Top5Logits[j]))
		}
		var ttft, toks []float64
		for k := 0; k < *reps; k++ {
			out, a, d := run(ge.PromptIDs, img, steps)
			ttft = append(ttft, float64(a.Microseconds())/1000)
			toks = append(toks, float64(len(out)-1)/d.Seconds())
		}
		rw := row{Name: ge.Name, Size: fmt.Sprintf("%dx%d", ge.Width, ge.Height), Grid: fmt.Sprintf("%dx%d", r.Grid[1], r.Grid[2]),
			Tokens: r.Tokens, Match: match, MaxDiff: worst, TTFTms: median(ttft), TokS: median(toks), HFTTFTms: ge.TTFTms, HFTokS: ge.TokPerS}
		rw.Pass = match >= min(*greedyGate, steps) && worst <= *tol
		if rw.Pass {
			pass++
		}
		if rw.TTFTms > 0 {
			rw.TTFTRatio = rw.HFTTFTms / rw.TTFTms
		}
		if rw.HFTokS > 0 {
			rw.TokSRatio = rw.TokS / rw.HFTokS
		}
		rows = append(rows, rw)
	}
	fmt.Printf("%s on %s (%s) vs transformers %s %s: %d/%d pass (greedy >= %d of %d tokens, first-step top-5 max|diff| <= %g)\n",
		g.Fixture, *device, b.Header().Provenance.Build.Precision, g.Dtype, g.Device, pass, len(rows), *greedyGate, len(g.Entries[0].GreedyIDs), *tol)
	fmt.Printf("%-16s %-9s %-6s %-6s %-6s %-5s %-9s | %-9s %-9s %-7s | %-9s %-9s %-7s\n", "image", "size", "grid", "tokens", "match", "pass", "max|diff|",
		"ttft_ms", "hf_ttft", "ratio", "tok/s", "hf_tok/s", "ratio")
	var s1, s2, s3, s4 float64
	for _, rw := range rows {
		fmt.Printf("%-16s %-9s %-6s %-6d %-6d %-5v %-9.3g | %-9.2f %-9.2f %-7.2f | %-9.0f %-9.0f %-7.2f\n", rw.Name, rw.Size, rw.Grid, rw.Tokens, rw.Match,
			rw.Pass, rw.MaxDiff, rw.TTFTms, rw.HFTTFTms, rw.TTFTRatio, rw.TokS, rw.HFTokS, rw.TokSRatio)
		s1 += rw.TTFTms
		s2 += rw.HFTTFTms
		s3 += rw.TokS
		s4 += rw.HFTokS
	}
	n := float64(len(rows))
	fmt.Printf("mean: ttft %.2f ms vs transformers %.2f ms (transformers/ours %.2fx); output %.0f tok/s vs %.0f (ours/transformers %.2fx)\n",
		s1/n, s2/n, s2/s1, s3/n, s4/n, s3/s4)
	if *outPath != "" {
		j, _ := json.MarshalIndent(map[string]any{"pass": pass, "rows": rows}, "", " ")
		os.WriteFile(*outPath, j, 0o644)
	}
}
