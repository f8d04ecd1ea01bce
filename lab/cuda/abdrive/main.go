// Command abdrive is a lab driver (not product): the before/after comparison of two builds of
// libmodelqual_cuda.so for the families that before_after.py's ctypes driver does not open, the
// vision family (qwen3vl: images through the tower, then greedy decoding) and the text-to-image
// family (zimage), through the product's own engine (package native, --device cuda). Both
// libraries are loaded in this one process (MODELQUAL_CUDA_LIB is set before each engine opens;
// each engine dlopen()s its own), and rounds alternate which goes first, so drift in clocks or
// temperature falls on both. Per family and batch it prints the medians, the ratio after/before
// and whether both produced the same tokens (or the same image bytes).
//
//	abdrive -before before.so -after after.so -vl-bundle DIR -vl-snapshot DIR -vl-golden G.json \
//	    -z-bundle DIR -rounds 5 -out ab_vl_zimage.json
package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/modelqual/modelqual/native"
	"github.com/modelqual/modelqual/native/bundle"
	"github.com/modelqual/modelqual/server/vision"
)

// openBoth opens the bundle twice, once on each library.
func openBoth(path string, libs []string, p native.Params) (*bundle.Bundle, []*native.Engine) {
	b, err := bundle.Open(path)
	if err != nil {
		log.Fatal(err)
	}
	var es []*native.Engine
	for _, lib := range libs {
		if err := os.Setenv("MODELQUAL_CUDA_LIB", lib); err != nil {
			log.Fatal(err)
		}
		e, err := native.Open(b, p)
		if err != nil {
			log.Fatalf("open %s on %s: %v", path, lib, err)
		}
		es = append(es, e)
	}
	return b, es
}

func median(v []float64) float64 {
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	return s[len(s)/2]
}

type result struct {
	Family, What          string
	Batch                 int
	Before, After         []float64
	BeforeMed, AfterMed   float64
	Ratio                 float64
	Same                  bool
	Unit                  string
	BeforeTTFT, AfterTTFT float64 `json:",omitempty"`
}

// decodeRun adds B image requests (the same image and prompt) and steps until all finish; it
// returns every sequence's tokens, decode tokens/s (after each sequence's first token: the
// tower and the prefill stay out) and the time to the last first token.
func decodeRun(e *native.Engine, B, n int, ids []int32, im *native.Image) ([][]int32, float64, time.Duration) {
	t0 := time.Now()
	seqs := make([]native.SeqID, B)
	idx := map[native.SeqID]int{}
	for i := range seqs {
		id, err := e.AddImage(ids, im, native.Sampling{MaxNewTokens: n, IgnoreEOS: true})
		if err != nil {
			log.Fatal(err)
		}
		seqs[i] = id
		idx[id] = i
	}
	got := make([][]int32, B)
	var tFirst, tEnd time.Time
	firsts := 0
	for e.Active() > 0 {
		if _, err := e.Step(func(ev native.Event) {
			i, ok := idx[ev.Seq]
			if !ok || ev.Token < 0 {
				return
			}
			now := time.Now()
			if len(got[i]) == 0 {
				firsts++
				if firsts == B {
					tFirst = now
				}
			}
			got[i] = append(got[i], ev.Token)
			tEnd = now
		}); err != nil {
			log.Fatal(err)
		}
	}
	return got, float64(B*(n-1)) / tEnd.Sub(tFirst).Seconds(), tFirst.Sub(t0)
}

func sameTokens(a, b [][]int32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if fmt.Sprint(a[i]) != fmt.Sprint(b[i]) {
			return false
		}
	}
	return true
}

func vl(libs []string, bundlePath, snap, goldenPath string, rounds, steps int, batches []int) []result {
	var g struct {
		Entries []struct {
			Image     string  `json:"image"`
			PromptIDs []int32 `json:"prompt_ids"`
		} `json:"entries"`
	}
	raw, err := os.ReadFile(goldenPath)
	if err != nil {
		log.Fatal(err)
	}
	if err := json.Unmarshal(raw, &g); err != nil || len(g.Entries) == 0 {
		log.Fatalf("golden %s: %v (%d entries)", goldenPath, err, len(g.Entries))
	}
	pc, err := os.ReadFile(filepath.Join(snap, "preprocessor_config.json"))
	if err != nil {
		log.Fatal(err)
	}
	cfg, err := vision.ParseConfig(pc)
	if err != nil {
		log.Fatal(err)
	}
	en := g.Entries[0]
	data, err := os.ReadFile(en.Image)
	if err != nil {
		log.Fatal(err)
	}
	mime := "image/png"
	if strings.HasSuffix(en.Image, ".jpg") {
		mime = "image/jpeg"
	}
	dec, err := vision.Decode(data, mime, 1<<26)
	if err != nil {
		log.Fatal(err)
	}
	pre, err := cfg.Preprocess(dec.RGB, dec.Width, dec.Height)
	if err != nil {
		log.Fatal(err)
	}
	im := &native.Image{Pixels: pre.Pixels, Grid: pre.Grid}
	maxB := 0
	for _, B := range batches {
		maxB = max(maxB, B)
	}
	b, es := openBoth(bundlePath, libs, native.Params{Threads: 2, MaxBatch: maxB, MaxContext: 1024, Device: "cuda"})
	defer b.Close()
	var out []result
	for _, B := range batches {
		for _, e := range es { // warm-up: graph captures and first-use costs out of the figures
			decodeRun(e, B, steps, en.PromptIDs, im)
		}
		r := result{Family: "qwen3vl", What: "image requests, greedy decode", Batch: B, Unit: "tok/s", Same: true}
		var ttft [2][]float64
		for k := 0; k < rounds; k++ {
			order := []int{0, 1}
			if k%2 == 1 {
				order = []int{1, 0}
			}
			var toks [2][][]int32
			for _, w := range order {
				got, tps, tf := decodeRun(es[w], B, steps, en.PromptIDs, im)
				toks[w] = got
				ttft[w] = append(ttft[w], float64(tf.Microseconds())/1000)
				if w == 0 {
					r.Before = append(r.Before, tps)
				} else {
					r.After = append(r.After, tps)
				}
			}
			r.Same = r.Same && sameTokens(toks[0], toks[1])
		}
		r.BeforeMed, r.AfterMed = median(r.Before), median(r.After)
		r.Ratio = r.AfterMed / r.BeforeMed
		r.BeforeTTFT, r.AfterTTFT = median(ttft[0]), median(ttft[1])
		out = append(out, r)
	}
	for _, e := range es {
		e.Close()
	}
	return out
}

func zimage(libs []string, bundlePath string, rounds, reps int) []result {
	b, es := openBoth(bundlePath, libs, native.Params{Threads: 2, MaxBatch: 1, MaxContext: 512, Device: "cuda"})
	defer b.Close()
	spec, err := es[0].ImageSpec()
	if err != nil {
		log.Fatal(err)
	}
	size := min(64, spec.MaxSize) / spec.SizeMultiple * spec.SizeMultiple
	var prompt, negative []int32
	for i := int32(0); i < 24; i++ {
		prompt = append(prompt, 100+7*i)
		negative = append(negative, 300+5*i)
	}
	var out []result
	for _, guided := range []bool{false, true} {
		// Guidance runs with a negative prompt only (the pipeline's rule): 0 without one.
		req := native.ImageRequest{Prompt: prompt, Width: size, Height: size, Steps: min(4, spec.MaxSteps), Seed: 42}
		what := "images, no guidance"
		if guided {
			req.Negative, req.Guidance = negative, 3.5
			what = "images, CFG pair"
		}
		gen := func(e *native.Engine) ([]byte, float64) {
			t0 := time.Now()
			var rgb []byte
			for k := 0; k < reps; k++ {
				res, err := e.GenerateImage(req, false)
				if err != nil {
					log.Fatal(err)
				}
				rgb = res.RGB
			}
			return rgb, float64(reps) / time.Since(t0).Seconds()
		}
		for _, e := range es {
			gen(e)
		}
		r := result{Family: "zimage", What: fmt.Sprintf("%s %dx%d, %d steps", what, size, size, req.Steps), Batch: 1, Unit: "images/s", Same: true}
		for k := 0; k < rounds; k++ {
			order := []int{0, 1}
			if k%2 == 1 {
				order = []int{1, 0}
			}
			var img [2][]byte
			for _, w := range order {
				rgb, ips := gen(es[w])
				img[w] = rgb
				if w == 0 {
					r.Before = append(r.Before, ips)
				} else {
					r.After = append(r.After, ips)
				}
			}
			r.Same = r.Same && bytes.Equal(img[0], img[1])
		}
		r.BeforeMed, r.AfterMed = median(r.Before), median(r.After)
		r.Ratio = r.AfterMed / r.BeforeMed
		out = append(out, r)
	}
	for _, e := range es {
		e.Close()
	}
	return out
}

func main() {
	before := flag.String("before", "", "the BEFORE libmodelqual_cuda.so")
	after := flag.String("after", "", "the AFTER libmodelqual_cuda.so")
	vlBundle := flag.String("vl-bundle", "", "qwen3vl cuda bundle (empty: skip)")
	vlSnap := flag.String("vl-snapshot", "", "the qwen3vl checkpoint snapshot (preprocessor_config.json)")
	vlGolden := flag.String("vl-golden", "fixtures/golden/qwen3vl-tiny.json", "golden with the image and prompt ids (its first entry)")
	zBundle := flag.String("z-bundle", "", "zimage cuda bundle (empty: skip)")
	rounds := flag.Int("rounds", 5, "alternating rounds")
	steps := flag.Int("steps", 64, "tokens per qwen3vl request")
	reps := flag.Int("reps", 10, "images per zimage timing")
	outPath := flag.String("out", "", "write the results as JSON too")
	flag.Parse()
	if *before == "" || *after == "" {
		log.Fatal("abdrive: -before and -after are required")
	}
	libs := []string{*before, *after}
	var res []result
	if *vlBundle != "" {
		res = append(res, vl(libs, *vlBundle, *vlSnap, *vlGolden, *rounds, *steps, []int{1, 32})...)
		for _, r := range res {
			fmt.Printf("%s batch %d: before %.1f after %.1f %s (ratio %.3f), same %v\n", r.Family, r.Batch, r.BeforeMed, r.AfterMed, r.Unit, r.Ratio, r.Same)
		}
	}
	if *zBundle != "" {
		res = append(res, zimage(libs, *zBundle, *rounds, *reps)...)
	}
	fmt.Printf("| family | what | batch | before (median of %d) | after | after/before | same output |\n|---|---|---|---|---|---|---|\n", *rounds)
	for _, r := range res {
		fmt.Printf("| %s | %s | %d | %.1f %s | %.1f %s | %.3f | %v |\n", r.Family, r.What, r.Batch, r.BeforeMed, r.Unit, r.AfterMed, r.Unit, r.Ratio, r.Same)
	}
	if *outPath != "" {
		b, _ := json.MarshalIndent(res, "", " ")
		if err := os.WriteFile(*outPath, b, 0o644); err != nil {
			log.Fatal(err)
		}
	}
}
