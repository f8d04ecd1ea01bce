package spec

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/onsi/ginkgo/v2"

	"github.com/modelqual/modelqual/server/tokenizer"
)

// EOSGolden is a transformers golden over prompts whose greedy continuation reaches an
// end-of-sequence token (fixtures/golden/<fixture>-eos.json, made by make_golden.py from the
// family's eos_corpus.jsonl), with the end-of-sequence ids as transformers resolves them.
type EOSGolden struct {
	Golden
	// EOSTokenIDs are model.generation_config.eos_token_id as a list: generate() stops at any.
	EOSTokenIDs []int32 `json:"eos_token_ids"`
	// TokenizerEOSTokenID is tokenizer.eos_token_id (tokenizer_config.json's eos_token).
	TokenizerEOSTokenID *int32 `json:"tokenizer_eos_token_id"`
}

// LoadEOSGolden reads an EOS golden and refuses one without eos_token_ids.
func LoadEOSGolden(path string) (*EOSGolden, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("spec.LoadEOSGolden: %w; make it with fixtures/golden/make_golden.py --corpus families/<f>/eos_corpus.jsonl", err)
	}
	var g EOSGolden
	if err := json.Unmarshal(raw, &g); err != nil {
		return nil, fmt.Errorf("spec.LoadEOSGolden: %s: %w", path, err)
	}
	if len(g.EOSTokenIDs) == 0 || len(g.Prompts) == 0 {
		return nil, fmt.Errorf("spec.LoadEOSGolden: %s has no eos_token_ids or no prompts; regenerate it with fixtures/golden/make_golden.py", path)
	}
	return &g, nil
}

// EOSInput is the input of NaturalEOS and CheckEOS.
type EOSInput struct {
	// API reaches the served model.
	API *API
	// Path is the EOS golden (fixtures/golden/<fixture>-eos.json).
	Path string
	// CheckpointDir holds the checkpoint's generation_config.json and tokenizer_config.json;
	// empty for a server the harness did not build (then only the served behaviour is checked).
	CheckpointDir string
	// Tokenizer decodes golden tokens and resolves tokenizer_config.json's eos_token.
	Tokenizer *tokenizer.Tokenizer
	// TieMargin > 0 (a reduced-precision GPU run, thresholds greedy_tie_margin): a served path
	// that leaves transformers' at a step whose golden top-two logits lie within the margin ends
	// that prompt's free-running comparison, and the stop is then checked teacher-forced: the
	// prompt followed by transformers' tokens up to its end-of-sequence id must stop at once.
	TieMargin float64
}

// CheckEOS is NaturalEOS's core. It checks that
//
//   - the checkpoint's generation_config.json eos_token_id (an int or a list) and
//     tokenizer_config.json's eos_token name the ids transformers resolved for the golden;
//   - for every golden prompt, /v1/completions at temperature 0 without ignore_eos, streamed
//     and not, stops where transformers' greedy tokens first reach any of those ids: the text
//     before it, finish_reason "stop", usage counting the end-of-sequence token; a prompt that
//     reaches none runs to max_tokens with finish_reason "length".
//
// At least one golden prompt must stop early, so the gate can fail when EOS is ignored.
func CheckEOS(ctx context.Context, in EOSInput) error {
	const fn = "spec.CheckEOS"
	switch {
	case in.API == nil:
		return fmt.Errorf("%s: EOSInput.API is nil", fn)
	case in.Tokenizer == nil:
		return fmt.Errorf("%s: EOSInput.Tokenizer is nil", fn)
	case in.Path == "":
		return fmt.Errorf("%s: EOSInput.Path is empty; pass fixtures/golden/<fixture>-eos.json", fn)
	}
	g, err := LoadEOSGolden(in.Path)
	if err != nil {
		return err
	}
	eos := map[int32]bool{}
	for _, id := range g.EOSTokenIDs {
		eos[id] = true
	}
	var problems []string
	if in.CheckpointDir != "" {
		problems = append(problems, checkEOSFiles(in.CheckpointDir, in.Tokenizer, g)...)
	}
	early, forced, left := 0, 0, 0
	for _, gp := range g.Prompts {
		steps := len(gp.GreedyIDs)
		want := openAIFinish(in.Tokenizer, gp.PromptIDs, gp.GreedyIDs, eos, steps, nil, false)
		stop := want.Tokens - 1 // the end-of-sequence step, when want.Finish is "stop"
		diverged := false
		for _, stream := range []bool{false, true} {
			ans, err := in.API.Complete(ctx, "/v1/completions", eosBody(gp.PromptIDs, steps, stream))
			p := finishProblem(ans, err, want, stream)
			if p != "" && err == nil && in.TieMargin > 0 {
				ref := gp.GreedyIDs[:want.Tokens]
				if want.Finish == "stop" {
					ref = ref[:stop]
				}
				if k := divergenceStep(in.Tokenizer, gp.PromptIDs, ref, ans.Text); k >= 0 && k < len(ref) && k < len(gp.Steps) &&
					nearTie(gp.Steps[k], gp.GreedyIDs[k], in.TieMargin) {
					p, diverged = "", true
				}
			}
			if p != "" {
				problems = append(problems, fmt.Sprintf("prompt %q (stream %v; transformers' greedy tokens %v, eos ids %v): %s", gp.Name, stream, gp.GreedyIDs, g.EOSTokenIDs, p))
			}
		}
		switch {
		case want.Finish != "stop":
		case !diverged:
			early++
		case stop < len(gp.Steps) && nearTie(gp.Steps[stop], gp.GreedyIDs[stop], in.TieMargin):
			left++ // the end-of-sequence id itself is a near-tie: nothing to hold the engine to
		default:
			// teacher-forced: transformers' tokens before its end-of-sequence id, then one step
			prompt := append(append([]int32(nil), gp.PromptIDs...), gp.GreedyIDs[:stop]...)
			wantF := openAIFinish(in.Tokenizer, prompt, gp.GreedyIDs[stop:], eos, steps-stop, nil, false)
			for _, stream := range []bool{false, true} {
				ans, err := in.API.Complete(ctx, "/v1/completions", eosBody(prompt, steps-stop, stream))
				if p := finishProblem(ans, err, wantF, stream); p != "" {
					problems = append(problems, fmt.Sprintf("prompt %q followed by transformers' %d tokens before its end-of-sequence id (stream %v; eos ids %v): %s", gp.Name, stop, stream, g.EOSTokenIDs, p))
				}
			}
			early++
			forced++
		}
	}
	if in.TieMargin > 0 {
		ginkgo.GinkgoWriter.Printf("natural EOS: %d prompts stop where transformers stops, %d of them teacher-forced after a near-tie; %d left unchecked (the end-of-sequence step itself a near-tie)\n", early, forced, left)
	}
	if early == 0 {
		return fmt.Errorf("%s: no prompt of %s reaches an end-of-sequence id %v within its %d steps where this run can follow transformers, so the gate could not see EOS ignored: add prompts to the family's eos_corpus.jsonl and regenerate", fn, in.Path, g.EOSTokenIDs, g.GreedySteps)
	}
	if len(problems) > 0 {
		return errors.New("natural-EOS gate: generation does not end where transformers' does:\n  " + strings.Join(problems, "\n  "))
	}
	return nil
}

// eosBody is a greedy /v1/completions request without ignore_eos.
func eosBody(prompt []int32, maxTokens int, stream bool) map[string]any {
	body := map[string]any{"prompt": prompt, "max_tokens": maxTokens, "temperature": 0, "stream": stream}
	if stream {
		body["stream_options"] = map[string]any{"include_usage": true}
	}
	return body
}

// checkEOSFiles reads the checkpoint's end-of-sequence settings on its own (not through the
// server's or the bundle's code) and compares them with transformers' resolution.
func checkEOSFiles(dir string, tok *tokenizer.Tokenizer, g *EOSGolden) []string {
	var out []string
	var gc struct {
		EOS json.RawMessage `json:"eos_token_id"`
	}
	raw, err := os.ReadFile(filepath.Join(dir, "generation_config.json"))
	if err == nil {
		err = json.Unmarshal(raw, &gc)
	}
	if err != nil {
		return []string{fmt.Sprintf("generation_config.json: %v", err)}
	}
	var ids []int32
	var one int32
	if json.Unmarshal(gc.EOS, &one) == nil {
		ids = []int32{one}
	} else if err := json.Unmarshal(gc.EOS, &ids); err != nil {
		out = append(out, fmt.Sprintf("generation_config.json eos_token_id %s is neither an integer nor a list", gc.EOS))
	}
	if !slices.Equal(ids, g.EOSTokenIDs) {
		out = append(out, fmt.Sprintf("generation_config.json eos_token_id %v, transformers resolved %v", ids, g.EOSTokenIDs))
	}
	if g.TokenizerEOSTokenID != nil {
		name := tok.EOSToken()
		id, ok := tok.SpecialID(name)
		if !ok || id != *g.TokenizerEOSTokenID {
			out = append(out, fmt.Sprintf("tokenizer_config.json eos_token %q is id %d (found %v), transformers' tokenizer.eos_token_id is %d", name, id, ok, *g.TokenizerEOSTokenID))
		}
	}
	return out
}

// NaturalEOS asserts that generation without ignore_eos ends where transformers' greedy tokens
// reach an end-of-sequence id (CheckEOS).
func NaturalEOS(ctx context.Context, input func() EOSInput) {
	ginkgo.It("stops at the end-of-sequence ids transformers stops at (generation_config.json, tokenizer_config.json), without ignore_eos", Gate(GateParity), Task(TaskText), func(sctx ginkgo.SpecContext) {
		c, cancel := specContext(ctx, sctx)
		defer cancel()
		passGate(CheckEOS(c, input()))
	})
}
