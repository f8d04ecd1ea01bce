package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"

	"github.com/modelqual/modelqual/fixtures"
	"github.com/modelqual/modelqual/native"
	"github.com/modelqual/modelqual/native/bundle"
	"github.com/modelqual/modelqual/qual/manifest"
	"github.com/modelqual/modelqual/server/tokenizer"
)

func init() {
	register("bundle", "build, inspect and validate model bundles", func(args []string) int {
		return bundleMain(args, os.Stdout, os.Stderr)
	})
}

const bundleUsage = `Usage:
  qual bundle build --checkpoint DIR --model ORG/NAME --revision REV --out FILE [options]
  qual bundle build --hub-cache DIR --model ORG/NAME [--revision REV] --out FILE [options]
  qual bundle build --mock [--mock-step-delay D] --out FILE
  qual bundle inspect FILE
  qual bundle validate FILE --manifest MANIFEST

build converts a Hugging Face checkpoint (config.json + *.safetensors, or a diffusers pipeline
folder with model_index.json; weights in one file or sharded with an index) into one bundle
file: header, provenance, tokenizer and config sections, 64-byte aligned tensors stored at
--precision. The runtime family that serves the checkpoint's architecture is taken from this
binary's registry (qual families lists it). Its tensors are renamed to the names the family
reads, as transformers and diffusers load the layouts they accept (with or without the
base-model prefix, a tied head stored or not, a causal LM saved as a pipeline's text encoder),
and checked: a tensor the family reads that is missing or of another shape than config.json
implies, or one it never reads, fails the build naming the tensor, both shapes and the files
searched. The written bundle's tokenizer and chat template are loaded before it is kept. REV must be a
40-hex commit; with --hub-cache it defaults to what refs/main names. inspect prints the header
and provenance as JSON after verifying every checksum. validate exits 1 naming the first field
where the bundle differs from the manifest (family, checkpoint, revision, precision, backend,
max context).
Run 'qual bundle build --help' for build options.
`

func bundleMain(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprint(stderr, bundleUsage)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	switch args[0] {
	case "build":
		return bundleBuild(args[1:], stdout, stderr)
	case "inspect":
		return bundleInspect(args[1:], stdout, stderr)
	case "validate":
		return bundleValidate(args[1:], stdout, stderr)
	}
	fmt.Fprintf(stderr, "qual bundle: unknown subcommand %q; want build, inspect or validate\n\n%s", args[0], bundleUsage)
	return 2
}

// bundleParseArgs parses flags that may come before or after positional arguments
// ("validate FILE --manifest M"); the standard flag package stops at the first positional.
func bundleParseArgs(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return pos, nil
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}

// bundleFlagExit maps a flag parse error to an exit code (--help is success).
func bundleFlagExit(err error) int {
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	return 2
}

func bundleBuild(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("qual bundle build", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o bundle.BuildOptions
	var cache string
	fs.StringVar(&o.CheckpointDir, "checkpoint", "", "checkpoint `DIR` (config.json, *.safetensors, tokenizer.json, tokenizer_config.json)")
	fs.StringVar(&o.HubCache, "hub-cache", "", "Hugging Face hub cache `DIR` holding models--ORG--NAME (or its parent)")
	fs.StringVar(&o.Model, "model", "", "checkpoint id `ORG/NAME` recorded in provenance (inferred from a hub snapshot path)")
	fs.StringVar(&o.Revision, "revision", "", "immutable 40-hex commit of the checkpoint (branch names are refused)")
	fs.StringVar(&o.Out, "out", "", "bundle `FILE` to write")
	fs.StringVar(&o.Precision, "precision", "fp32", "fp32, bf16 or fp16: the stored precision (the CPU engine computes in fp32 from it, the CUDA backend in it)")
	fs.IntVar(&o.MaxContext, "max-context", 0, fmt.Sprintf("max tokens per sequence (default: the model's position limit capped at %d)", bundle.MaxDefaultContext))
	fs.IntVar(&o.MaxBatch, "max-batch", bundle.DefaultMaxBatch, "max sequences decoded together")
	fs.StringVar(&o.Backend, "backend", "cpu", "cpu or cuda")
	fs.BoolVar(&o.Mock, "mock", false, "build a mock-family bundle (no weights; one deterministic token per step)")
	fs.DurationVar(&o.MockStepDelay, "mock-step-delay", 0, "per-step delay of the mock engine")
	fs.IntVar(&o.MockVocab, "mock-vocab", bundle.DefaultMockVocab, "vocabulary size of the mock")
	fs.StringVar(&o.TokenizerDir, "mock-tokenizer", "", "`DIR` with tokenizer.json and tokenizer_config.json for the mock (default: the gpt2-tiny fixture in --cache)")
	fs.StringVar(&cache, "cache", "", "modelqual cache `DIR` for the mock's default tokenizer (default $MODELQUAL_CACHE)")
	fs.Usage = func() {
		fmt.Fprint(stderr, bundleUsage, "\nbuild options:\n")
		fs.PrintDefaults()
	}
	pos, err := bundleParseArgs(fs, args)
	if err != nil {
		return bundleFlagExit(err)
	}
	if len(pos) > 0 {
		fmt.Fprintf(stderr, "qual bundle build: unexpected argument %q; the output file is --out FILE\n", pos[0])
		return 2
	}
	if o.Mock && o.TokenizerDir == "" {
		if o.TokenizerDir, _, err = fixtures.Ensure(cache, fixtures.GPT2Tiny); err != nil {
			fmt.Fprintf(stderr, "qual bundle build: mock tokenizer: %v\n", err)
			return 1
		}
	}
	o.Resolve = native.BundleFamily
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	h, err := bundle.Build(ctx, o)
	if err != nil {
		fmt.Fprintf(stderr, "qual bundle build: %v\n", err)
		return 1
	}
	// Reopen: what was written must pass the same validation every consumer applies, and its
	// tokenizer and chat template must load as the server will load them, or it is not kept.
	b, err := bundle.Open(o.Out)
	if err == nil {
		if _, terr := tokenizer.FromBundle(b); terr != nil {
			b.Close()
			err = fmt.Errorf("its tokenizer does not load: %w", terr)
		}
	}
	if err != nil {
		os.Remove(o.Out)
		fmt.Fprintf(stderr, "qual bundle build: the written bundle does not validate, removed %s: %v\n", o.Out, err)
		return 1
	}
	defer b.Close()
	res := map[string]any{
		"bundle_path":   o.Out,
		"bundle_digest": b.Digest(),
		"family":        h.Family,
		"task":          h.Task,
		"checkpoint_id": h.Provenance.CheckpointID,
		"revision":      h.Provenance.Revision,
		"tensors":       len(h.Tensors),
		"build":         h.Provenance.Build,
	}
	// What the family's layout changed, so a user sees why the bundle's names differ from the
	// checkpoint's.
	if r := h.Provenance.RenamedTensors; len(r) > 0 {
		res["renamed_tensors"] = r
	}
	if s := h.Provenance.SkippedTensors; len(s) > 0 {
		res["skipped_tensors"] = s
	}
	return bundlePrintJSON(stdout, stderr, res)
}

func bundleInspect(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("qual bundle inspect", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, "Usage: qual bundle inspect FILE\n\nVerifies the bundle (structure and every sha256) and prints {\"bundle_path\", \"bundle_digest\", \"header\"} as JSON; the header holds the provenance.\n")
	}
	pos, err := bundleParseArgs(fs, args)
	if err != nil {
		return bundleFlagExit(err)
	}
	if len(pos) != 1 {
		fs.Usage()
		return 2
	}
	b, err := bundle.Open(pos[0])
	if err != nil {
		fmt.Fprintf(stderr, "qual bundle inspect: %v\n", err)
		return 1
	}
	defer b.Close()
	return bundlePrintJSON(stdout, stderr, map[string]any{"bundle_path": b.Path(), "bundle_digest": b.Digest(), "header": b.Header()})
}

func bundleValidate(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("qual bundle validate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	mpath := fs.String("manifest", "", "family manifest.yaml the bundle must match")
	fs.Usage = func() {
		fmt.Fprint(stderr, "Usage: qual bundle validate FILE --manifest MANIFEST\n\nVerifies the bundle and checks it against the manifest; exits 1 naming the first mismatching field.\n\n")
		fs.PrintDefaults()
	}
	pos, err := bundleParseArgs(fs, args)
	if err != nil {
		return bundleFlagExit(err)
	}
	if len(pos) != 1 || *mpath == "" {
		fs.Usage()
		return 2
	}
	m, err := manifest.Load(*mpath)
	if err != nil {
		fmt.Fprintf(stderr, "qual bundle validate: %v\n", err)
		return 1
	}
	b, err := bundle.Open(pos[0])
	if err != nil {
		fmt.Fprintf(stderr, "qual bundle validate: %v\n", err)
		return 1
	}
	defer b.Close()
	if err := b.Header().Check(m.Expect()); err != nil {
		fmt.Fprintf(stderr, "qual bundle validate: %v\n", err)
		return 1
	}
	return bundlePrintJSON(stdout, stderr, map[string]any{"bundle_path": b.Path(), "bundle_digest": b.Digest(), "manifest": *mpath, "ok": true})
}

func bundlePrintJSON(stdout, stderr io.Writer, v any) int {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		fmt.Fprintf(stderr, "qual: encode output: %v\n", err)
		return 1
	}
	fmt.Fprintln(stdout, strings.TrimSpace(string(b)))
	return 0
}
