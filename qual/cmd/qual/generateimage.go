package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/modelqual/modelqual/native"
	"github.com/modelqual/modelqual/native/bundle"
	"github.com/modelqual/modelqual/server/tokenizer"
)

func init() {
	register("generate-image", "run a text-to-image bundle's pipeline directly (no server), write the PNG, print its sha256 and the native task time", func(args []string) int {
		return generateImageMain(args, os.Stdout, os.Stderr)
	})
}

const generateImageUsage = `Usage:
  qual generate-image --bundle FILE --prompt TEXT --size WxH --steps N --guidance G --seed S
                      --out FILE.png [--negative-prompt TEXT] [--true-cfg S] [--device cpu|cuda] [--repeat N] [--threads N]

Runs the bundle's text-to-image pipeline in-process through package native (the prompt is
formatted and tokenized as the pipeline does: its chat template, then its tokenizer, or, for a
pipeline with two text encoders such as FLUX.1, both tokenizers padded to their lengths), writes the
image as a PNG and prints
  sha256 <hex>  bytes <n>  size <W>x<H>  native_task_ms <t>
where native_task_ms is the pipeline call alone (text encoder to pixels); with --repeat N the
pipeline runs N times on the open engine and each run after the first (the warmup) prints its
native_task_ms, then images_per_s over them. The server's
/v1/images/generations answers the same PNG bytes for the same controls.

Flags:
`

// parseSize reads "WxH".
func parseSize(s string) (int, int, error) {
	ws, hs, ok := strings.Cut(s, "x")
	w, err1 := strconv.Atoi(ws)
	h, err2 := strconv.Atoi(hs)
	if !ok || err1 != nil || err2 != nil || w <= 0 || h <= 0 {
		return 0, 0, fmt.Errorf("%q is not WIDTHxHEIGHT (e.g. 512x512)", s)
	}
	return w, h, nil
}

func generateImageMain(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("qual generate-image", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, generateImageUsage); fs.PrintDefaults() }
	bundlePath := fs.String("bundle", "", "text-to-image bundle `FILE` (required)")
	prompt := fs.String("prompt", "", "the prompt `TEXT` (required)")
	negative := fs.String("negative-prompt", "", "the negative prompt `TEXT`, used when --guidance > 0 (FLUX.1: when --true-cfg > 1 and the flag is given)")
	trueCFG := fs.Float64("true-cfg", 0, "FLUX.1's true_cfg_scale: above 1 with --negative-prompt, real classifier-free guidance (0: off)")
	size := fs.String("size", "", "image size `WxH` (required)")
	steps := fs.Int("steps", 0, "denoising steps (required)")
	guidance := fs.Float64("guidance", -1, "classifier-free guidance scale; 0 turns guidance off (required)")
	seed := fs.Int64("seed", -1, "seed of the initial noise, as torch.Generator(\"cpu\").manual_seed (required)")
	out := fs.String("out", "", "write the PNG to `FILE` (required)")
	threads := fs.Int("threads", 0, "CPU threads (0 = all cores)")
	device := fs.String("device", "cpu", "cpu, or cuda (the pipeline on the GPU in bf16; loads libmodelqual_cuda.so, see make cuda)")
	repeat := fs.Int("repeat", 1, "run the pipeline N times on the open engine (the first is the warmup) and print each run's native_task_ms")
	if err := parseAll(fs, args); err != nil {
		return bundleFlagExit(err)
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "qual generate-image: unexpected arguments %q; the prompt goes in --prompt (see --help)\n", fs.Args())
		return 2
	}
	fail := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "qual generate-image: "+format+"\n", a...)
		return 1
	}
	switch {
	case *bundlePath == "":
		return fail("--bundle is required")
	case *prompt == "":
		return fail("--prompt is required")
	case *size == "":
		return fail("--size is required (WxH)")
	case *steps <= 0:
		return fail("--steps is required and must be >= 1")
	case *guidance < 0:
		return fail("--guidance is required and must be >= 0")
	case *seed < 0:
		return fail("--seed is required and must be >= 0")
	case *out == "":
		return fail("--out is required")
	}
	w, h, err := parseSize(*size)
	if err != nil {
		return fail("--size: %v", err)
	}
	b, err := bundle.Open(*bundlePath)
	if err != nil {
		return fail("%v", err)
	}
	defer b.Close()
	if b.Header().Task != "image" {
		return fail("%s serves task %q; generate-image needs a text-to-image bundle", *bundlePath, b.Header().Task)
	}
	tok, err := tokenizer.FromBundle(b)
	if err != nil {
		return fail("tokenizer of %s: %v", *bundlePath, err)
	}
	rule, err := native.ImagePromptFor(b.Header().Family, b.Header().Config)
	if err != nil {
		return fail("%v", err)
	}
	pids, err := rule.IDs(tok, *prompt)
	if err != nil {
		return fail("%v", err)
	}
	var nids, pids2, nids2 []int32
	negGiven := false
	fs.Visit(func(f *flag.Flag) { negGiven = negGiven || f.Name == "negative-prompt" })
	if !rule.TrueCFG || negGiven { // as the server: a true-CFG pipeline guides only with a sent negative prompt
		if nids, err = rule.IDs(tok, *negative); err != nil {
			return fail("%v", err)
		}
	}
	if rule.Second != nil {
		tok2, err := tokenizer.FromBundleFolder(b, rule.Second.Tokenizer)
		if err != nil {
			return fail("second tokenizer (%s) of %s: %v", rule.Second.Tokenizer, *bundlePath, err)
		}
		if pids2, err = rule.Second.IDs(tok2, *prompt); err != nil {
			return fail("%v", err)
		}
		if nids != nil {
			if nids2, err = rule.Second.IDs(tok2, *negative); err != nil {
				return fail("%v", err)
			}
		}
	}
	if *trueCFG != 0 && !rule.TrueCFG {
		return fail("--true-cfg: this pipeline has no true_cfg_scale")
	}
	if *repeat < 1 {
		return fail("--repeat must be >= 1")
	}
	e, err := native.Open(b, native.Params{Device: *device, Threads: *threads, MaxBatch: 1})
	if err != nil {
		return fail("%v", err)
	}
	defer e.Close()
	req := native.ImageRequest{Prompt: pids, Negative: nids, Prompt2: pids2, Negative2: nids2, Width: w, Height: h, Steps: *steps,
		Guidance: float32(*guidance), TrueCFG: float32(*trueCFG), Seed: uint64(*seed)}
	res, err := e.GenerateImage(req, false)
	if err != nil {
		return fail("%v", err)
	}
	if *repeat > 1 {
		// Timed runs after the first (warmup): each must give the first run's pixels.
		var total time.Duration
		for i := 2; i <= *repeat; i++ {
			r, err := e.GenerateImage(req, false)
			if err != nil {
				return fail("run %d: %v", i, err)
			}
			if !bytes.Equal(r.RGB, res.RGB) {
				return fail("run %d gave other pixels than run 1: the pipeline is not deterministic", i)
			}
			total += r.PipelineTime
			fmt.Fprintf(stdout, "run %d native_task_ms %.1f\n", i, float64(r.PipelineTime.Microseconds())/1000)
		}
		fmt.Fprintf(stdout, "images_per_s %.4f  over %d runs after the warmup\n", float64(*repeat-1)/total.Seconds(), *repeat-1)
	}
	pngBytes, err := native.EncodePNG(res.RGB, w, h)
	if err != nil {
		return fail("%v", err)
	}
	if err := os.WriteFile(*out, pngBytes, 0o644); err != nil {
		return fail("%v", err)
	}
	sum := sha256.Sum256(pngBytes)
	fmt.Fprintf(stdout, "sha256 %s  bytes %d  size %dx%d  native_task_ms %.1f\n", hex.EncodeToString(sum[:]), len(pngBytes), w, h, float64(res.PipelineTime.Microseconds())/1000)
	return 0
}
