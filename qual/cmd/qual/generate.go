package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"strings"

	"github.com/modelqual/modelqual/native"
	"github.com/modelqual/modelqual/native/bundle"
	"github.com/modelqual/modelqual/server/tokenizer"
)

func init() {
	register("generate", "run the native engine on one prompt directly (no server) and print tokens, text and top logprobs", func(args []string) int {
		return generateMain(args, os.Stdout, os.Stderr)
	})
}

const generateUsage = `Usage:
  qual generate --bundle FILE (--prompt TEXT | --prompt-ids 1,2,3) [--max-tokens N]
                [--temperature T] [--top-k K] [--top-p P] [--seed S] [--ignore-eos]
                [--device cpu|cuda] [--threads N] [--json]

Runs the bundle's model in-process through package native, with no server in between: the
quickest way to see what the engine itself produces for a prompt. --prompt is encoded with
the bundle's own tokenizer (no special tokens added); --prompt-ids passes ids as they are.

With --json it prints
  {"prompt_ids":[...], "ids":[...], "text":"...", "finish_reason":"stop|length",
   "top_logprobs":[[{"id":N,"logprob":X}, ...5], ...one list per generated token]}
where top_logprobs are the five most likely tokens of each step's full distribution
(log-softmax of the raw logits, before temperature, top-k or top-p). Without --json it
prints the generated text.

Flags:
`

// generateOutput is the --json document.
type generateOutput struct {
	PromptIDs    []int32     `json:"prompt_ids"`
	IDs          []int32     `json:"ids"`
	Text         string      `json:"text"`
	FinishReason string      `json:"finish_reason"`
	TopLogprobs  [][]logprob `json:"top_logprobs"`
}

type logprob struct {
	ID      int32   `json:"id"`
	Logprob float64 `json:"logprob"`
}

func generateMain(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("qual generate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	bundlePath := fs.String("bundle", "", "bundle file to run (required)")
	prompt := fs.String("prompt", "", "prompt text, encoded with the bundle's tokenizer")
	promptIDs := fs.String("prompt-ids", "", "prompt as comma-separated token ids")
	maxTokens := fs.Int("max-tokens", 16, "maximum number of tokens to generate")
	temperature := fs.Float64("temperature", 0, "sampling temperature; 0 = greedy")
	topK := fs.Int("top-k", 0, "sample among the K most likely tokens; 0 = off")
	topP := fs.Float64("top-p", 0, "nucleus sampling mass; 0 or 1 = off")
	seed := fs.Uint64("seed", 0, "sampling seed (same seed, same tokens)")
	ignoreEOS := fs.Bool("ignore-eos", false, "keep generating past EOS tokens")
	device := fs.String("device", "cpu", "cpu, or cuda (loads libmodelqual_cuda.so; see make cuda)")
	threads := fs.Int("threads", 0, "CPU threads; 0 = all cores")
	asJSON := fs.Bool("json", false, "print a JSON document with ids, text and top logprobs")
	fs.Usage = func() {
		fmt.Fprint(stderr, generateUsage)
		fs.PrintDefaults()
	}
	if err := parseAll(fs, args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	fail := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "qual generate: "+format+"\n", a...)
		return 1
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "qual generate: unexpected arguments %q\n", fs.Args())
		return 2
	}
	if *bundlePath == "" {
		fmt.Fprintln(stderr, "qual generate: --bundle is required")
		return 2
	}
	if (*prompt == "") == (*promptIDs == "") {
		fmt.Fprintln(stderr, "qual generate: pass exactly one of --prompt and --prompt-ids")
		return 2
	}

	b, err := bundle.Open(*bundlePath)
	if err != nil {
		return fail("%v", err)
	}
	defer b.Close()
	tj, err := b.Section(bundle.SectionTokenizer)
	if err != nil {
		return fail("%v", err)
	}
	tc, err := b.Section(bundle.SectionTokenizerConfig)
	if err != nil {
		return fail("%v", err)
	}
	tok, err := tokenizer.FromBytes(tj, tc)
	if err != nil {
		return fail("tokenizer of %s: %v", *bundlePath, err)
	}
	var ids []int32
	if *promptIDs != "" {
		if ids, err = parseIDList(*promptIDs); err != nil {
			return fail("--prompt-ids: %v", err)
		}
	} else {
		ids = tok.Encode(*prompt)
	}

	e, err := native.Open(b, native.Params{Device: *device, Threads: *threads, MaxBatch: 1})
	if err != nil {
		return fail("%v", err)
	}
	defer e.Close()
	id, err := e.Add(ids, native.Sampling{
		MaxNewTokens: *maxTokens,
		Temperature:  float32(*temperature),
		TopK:         *topK,
		TopP:         float32(*topP),
		Seed:         *seed,
		IgnoreEOS:    *ignoreEOS,
	})
	if err != nil {
		return fail("%v", err)
	}
	out := generateOutput{PromptIDs: ids, IDs: []int32{}, TopLogprobs: [][]logprob{}}
	for e.Active() > 0 {
		if _, err := e.Step(func(ev native.Event) {
			if ev.Seq != id {
				return
			}
			if ev.Token >= 0 {
				out.IDs = append(out.IDs, ev.Token)
			}
			if ev.Done {
				out.FinishReason = string(ev.Reason)
			}
		}); err != nil {
			return fail("%v", err)
		}
	}
	out.Text = tok.Decode(out.IDs)
	if !*asJSON {
		fmt.Fprintln(stdout, out.Text)
		return 0
	}
	if len(out.IDs) > 0 {
		// Step i's distribution is the logits at position len(prompt)-1+i of prompt+ids.
		seq := append(append([]int32{}, ids...), out.IDs[:len(out.IDs)-1]...)
		lg, err := e.Logits(seq)
		if err != nil {
			return fail("top logprobs: %v", err)
		}
		V := e.Info().VocabSize
		for i := range out.IDs {
			pos := len(ids) - 1 + i
			out.TopLogprobs = append(out.TopLogprobs, topLogprobs(lg[pos*V:(pos+1)*V], 5))
		}
	}
	enc := json.NewEncoder(stdout)
	if err := enc.Encode(out); err != nil {
		return fail("%v", err)
	}
	return 0
}

// topLogprobs returns the k most likely tokens of a log-softmax over row (float64, with the
// max subtracted for stability), most likely first, lowest id first on ties.
func topLogprobs(row []float32, k int) []logprob {
	mx := math.Inf(-1)
	for _, v := range row {
		mx = math.Max(mx, float64(v))
	}
	var sum float64
	for _, v := range row {
		sum += math.Exp(float64(v) - mx)
	}
	lse := mx + math.Log(sum)
	// One pass keeping the k best (ids ascend, so strict > keeps the lowest id on ties).
	best := make([]int32, 0, k+1)
	for i, v := range row {
		n := len(best)
		if n == k && v <= row[best[n-1]] {
			continue
		}
		j := n
		for j > 0 && v > row[best[j-1]] {
			j--
		}
		best = append(best, 0)
		copy(best[j+1:], best[j:n])
		best[j] = int32(i)
		if len(best) > k {
			best = best[:k]
		}
	}
	out := make([]logprob, len(best))
	for i, id := range best {
		out[i] = logprob{ID: id, Logprob: float64(row[id]) - lse}
	}
	return out
}

func parseIDList(s string) ([]int32, error) {
	var ids []int32
	for i, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		v, err := strconv.ParseInt(f, 10, 32)
		if err != nil {
			return nil, fmt.Errorf("item %d %q is not a token id", i, f)
		}
		ids = append(ids, int32(v))
	}
	return ids, nil
}
