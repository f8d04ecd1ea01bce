package spec

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/modelqual/modelqual/server/tokenizer"
)

// IdentityInput is the input of CheckIdentity.
type IdentityInput struct {
	// API reaches the server; its Model is the name the gates will send.
	API *API
	// Checkpoint names what the family qualifies ("modelqual-fixtures/qwen3-tiny@9c59…"), for
	// the message.
	Checkpoint string
	// ModelGiven: the model name was given by the user (--model); one the server does not list
	// is then an error rather than replaced by the one model it lists.
	ModelGiven bool
	// Golden is the checkpoint's transformers golden: the fingerprint is its greedy tokens;
	// nil checks /v1/models only.
	Golden *Golden
	// TextGolden, when set, replaces Golden for a server that takes text prompts only
	// (API.TextPrompt): the same corpus encoded as tokenizer(text) encodes it, with the <s> a
	// Llama tokenizer adds (fixtures/golden/<fixture>-text.json), since such a server adds it.
	TextGolden *Golden
	// Tokenizer decodes the golden's tokens.
	Tokenizer *tokenizer.Tokenizer
	// Prompts and Steps bound the fingerprint: the first Prompts golden prompts (3 when 0),
	// Steps greedy tokens each (8 when 0).
	Prompts, Steps int
	// Tolerance bounds |served − golden| on the chosen tokens' logprobs, where the server
	// offers logprobs (0.05 when 0: loose, an identity check and not the parity gate; two
	// different checkpoints differ by far more).
	Tolerance float64
}

// IdentityResult is what the identity check found.
type IdentityResult struct {
	// Model is the model name to send (the one the server lists when it lists exactly one and
	// none was given).
	Model string
	// Listed is /v1/models' ids.
	Listed []string
	// Fingerprint says what was compared ("3 golden prompts × 8 greedy tokens, logprobs of 24
	// tokens").
	Fingerprint string
}

// ErrIdentity marks a server that serves another checkpoint than the family's.
var ErrIdentity = errors.New("identity check")

// CheckIdentity checks, before any gate runs against a server the harness did not start, that
// it serves the family's checkpoint: /v1/models lists the model name (or exactly one model,
// which is then used), and its greedy tokens on fixed golden prompts are the golden's, with
// the chosen tokens' logprobs near the golden's where logprobs are offered. A server without
// ignore_eos may end a fingerprint prompt early at end of sequence: a prefix of the golden
// text with finish_reason "stop" is accepted. The error, wrapping ErrIdentity, names what
// differs in one message.
func CheckIdentity(ctx context.Context, in IdentityInput) (*IdentityResult, error) {
	const fn = "spec.CheckIdentity"
	switch {
	case in.API == nil:
		return nil, fmt.Errorf("%s: IdentityInput.API is nil", fn)
	case in.Golden != nil && in.Tokenizer == nil:
		return nil, fmt.Errorf("%s: IdentityInput.Tokenizer is nil", fn)
	}
	res := &IdentityResult{Model: in.API.Model}
	var models struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if err := in.API.getJSON(ctx, http.MethodGet, "/v1/models", nil, &models); err != nil {
		return res, fmt.Errorf("%w: GET /v1/models at %s: %v", ErrIdentity, in.API.BaseURL, err)
	}
	for _, m := range models.Data {
		res.Listed = append(res.Listed, m.ID)
	}
	if !slices.Contains(res.Listed, in.API.Model) {
		switch {
		case len(res.Listed) == 1 && !in.ModelGiven:
			res.Model = res.Listed[0]
		case len(res.Listed) == 0:
			return res, fmt.Errorf("%w: GET /v1/models at %s lists no model", ErrIdentity, in.API.BaseURL)
		default:
			return res, fmt.Errorf("%w: the server at %s lists models %q, not %q; pass the served name with --model (MODELQUAL_EXTERNAL_MODEL)",
				ErrIdentity, in.API.BaseURL, res.Listed, in.API.Model)
		}
	}
	if in.Golden == nil {
		res.Fingerprint = "/v1/models only (the family has no transformers golden)"
		return res, nil
	}
	api := &API{BaseURL: in.API.BaseURL, Model: res.Model, APIKey: in.API.APIKey, HTTP: in.API.HTTP, TextPrompt: in.API.TextPrompt}
	nPrompts, steps, tol := in.Prompts, in.Steps, in.Tolerance
	if nPrompts == 0 {
		nPrompts = 3
	}
	if steps == 0 {
		steps = 8
	}
	if tol == 0 {
		tol = 0.05
	}
	if in.TextGolden != nil && api.TextPrompt != nil {
		if ok, _ := api.tokenPrompts(ctx); !ok {
			in.Golden = in.TextGolden
		}
	}
	values, _ := GoldenHasLogprobs(in.Golden)
	withLogprobs := values
	var compared, scored int
	var uncomparable []string
	for i, gp := range in.Golden.Prompts {
		if i == nPrompts {
			break
		}
		n := min(steps, len(gp.GreedyIDs))
		if n == 0 || len(gp.PromptIDs) == 0 {
			continue
		}
		body := map[string]any{"prompt": gp.PromptIDs, "max_tokens": n, "temperature": 0, "ignore_eos": true}
		if withLogprobs {
			body["logprobs"] = 1
		}
		ans, err := api.Complete(ctx, "/v1/completions", body)
		if err != nil && withLogprobs && StatusOf(err)/100 == 4 {
			withLogprobs = false // a server without logprobs: the tokens alone
			delete(body, "logprobs")
			ans, err = api.Complete(ctx, "/v1/completions", body)
		}
		if err != nil {
			return res, fmt.Errorf("%w: golden prompt %q (%d token ids) could not be generated: %v", ErrIdentity, gp.Name, len(gp.PromptIDs), err)
		}
		want := continuation(in.Tokenizer, gp.PromptIDs, gp.GreedyIDs[:n])
		early := ans.FinishReason == "stop" && strings.HasPrefix(want, ans.Text)
		// With per-token logprobs the tokens are compared by their bytes (alignTokens), so an
		// engine that decodes an invalid byte-fallback run otherwise than tokenizers (which
		// spells it U+FFFD) is judged on the tokens it generated.
		sameTokens := false
		if len(ans.Logprobs) > 0 {
			al := alignTokens(in.Tokenizer, gp.GreedyIDs[:n], ans.Logprobs)
			if al.Differs != "" && !early {
				return res, fmt.Errorf("%w: the server at %s (model %q) does not serve %s: on golden prompt %q its greedy tokens leave the checkpoint's at token %d: %s",
					ErrIdentity, in.API.BaseURL, res.Model, in.Checkpoint, gp.Name, al.At, al.Differs)
			}
			sameTokens = al.Differs == ""
		}
		textSame := sameTokens || ans.Text == want || early || heldBackTail(ans.Text, want) || invalidBytesSpeltOtherwise(want, ans.Text)
		if !textSame && len(ans.Logprobs) == 0 && strings.ContainsRune(want, utf8.RuneError) {
			// Its tokens decode to bytes that form no UTF-8 character, which engines render
			// as they choose (Ollama may drop the characters after them); without logprobs
			// this prompt cannot tell tokens apart, so the fingerprint rests on the others.
			uncomparable = append(uncomparable, gp.Name)
			continue
		}
		if !textSame {
			return res, fmt.Errorf("%w: the server at %s (model %q) does not serve %s: on golden prompt %q its greedy tokens are %q, the checkpoint's are %q (they part at token %d)",
				ErrIdentity, in.API.BaseURL, res.Model, in.Checkpoint, gp.Name, clip(ans.Text, 60), clip(want, 60), divergenceStep(in.Tokenizer, gp.PromptIDs, gp.GreedyIDs[:n], ans.Text))
		}
		compared += n
		if !withLogprobs || ans.Logprobs == nil {
			withLogprobs = false
			continue
		}
		for _, p := range alignTokens(in.Tokenizer, gp.GreedyIDs[:n], ans.Logprobs).Pairs {
			if p.Merged() {
				continue
			}
			st := gp.Steps[p.Ref]
			k := slices.Index(st.Top5IDs, gp.GreedyIDs[p.Ref])
			if k < 0 {
				continue
			}
			if d := math.Abs(ans.Logprobs[p.Served].Logprob - st.Top5Logprobs[k]); d > tol || math.IsNaN(d) {
				return res, fmt.Errorf("%w: the server at %s (model %q) does not serve %s: on golden prompt %q token %d (%q) has logprob %.4g, the checkpoint's is %.4g (|Δ| %.3g > %.3g: same tokens, other weights?)",
					ErrIdentity, in.API.BaseURL, res.Model, in.Checkpoint, gp.Name, p.Ref, ans.Logprobs[p.Served].Token, ans.Logprobs[p.Served].Logprob, st.Top5Logprobs[k], d, tol)
			}
			scored++
		}
	}
	if compared == 0 && len(uncomparable) > 0 {
		return res, fmt.Errorf("%w: the server at %s (model %q) answers no golden prompt comparably: every one (%s) generates bytes that form no UTF-8 character, which it reports otherwise than tokenizers and without logprobs",
			ErrIdentity, in.API.BaseURL, res.Model, strings.Join(uncomparable, ", "))
	}
	res.Fingerprint = fmt.Sprintf("greedy tokens of %d golden prompts (%d tokens)", min(nPrompts, len(in.Golden.Prompts))-len(uncomparable), compared)
	if len(uncomparable) > 0 {
		res.Fingerprint += fmt.Sprintf("; %s not comparable as text (undecodable bytes, no logprobs)", strings.Join(uncomparable, ", "))
	}
	if scored > 0 {
		res.Fingerprint += fmt.Sprintf(", logprobs of %d of them within %.3g", scored, tol)
	}
	return res, nil
}

// heldBackTail reports whether served is want without an incomplete UTF-8 character at its
// end (decoded as U+FFFD), which an engine may hold back until the character completes.
func heldBackTail(served, want string) bool {
	trimmed := strings.TrimRight(want, "\uFFFD")
	return trimmed != want && served == trimmed
}

// continuation is the text generated after prompt as it reads in context: the decode of
// prompt and generated tokens together, less the prompt's, as tokenizers' DecodeStream primed
// with the prompt gives it (vLLM, TGI and qual-server answer this text). A SentencePiece
// decoder strips the leading space of a sequence, so the generated tokens decoded alone would
// lose the space their first word piece carries after a prompt. When the prompt's text is not
// a prefix of the whole (the prompt ends inside a character that the generated bytes finish),
// the generated tokens' own decode stands in.
func continuation(tok *tokenizer.Tokenizer, prompt, gen []int32) string {
	pre := tok.Decode(prompt)
	full := tok.Decode(append(append([]int32(nil), prompt...), gen...))
	if strings.HasPrefix(full, pre) {
		return full[len(pre):]
	}
	return tok.Decode(gen)
}

// invalidBytesSpeltOtherwise reports whether served is want where each U+FFFD of want (a
// byte of a byte-fallback run that forms no UTF-8 character, which tokenizers' decoder spells
// U+FFFD byte by byte) is dropped or read as one other character: how llama.cpp and Ollama
// render such runs. The tokens are the same; only their text is reported otherwise.
func invalidBytesSpeltOtherwise(want, served string) bool {
	if !strings.ContainsRune(want, utf8.RuneError) {
		return false
	}
	var re strings.Builder
	re.WriteString("^")
	for _, part := range strings.Split(want, string(utf8.RuneError)) {
		re.WriteString(regexp.QuoteMeta(part))
		re.WriteString("(?s:.?)")
	}
	pattern := strings.TrimSuffix(re.String(), "(?s:.?)") + "$"
	ok, err := regexp.MatchString(pattern, served)
	return err == nil && ok
}
