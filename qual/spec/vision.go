package spec

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/crc32"
	"math"
	"os"
	"path/filepath"
	"strings"

	"github.com/onsi/ginkgo/v2"
	"github.com/onsi/gomega"

	"github.com/modelqual/modelqual/fixtures"
	"github.com/modelqual/modelqual/server/tokenizer"
)

// The vision-language gates: chat with one image against transformers' goldens, the image
// refusal contract, image sensitivity and the image corpus's fingerprints. They speak HTTP
// only, so they qualify any OpenAI-compatible server that takes image_url content parts.

// VisionInput is the input of the vision gates.
type VisionInput struct {
	// API reaches the served model.
	API *API
	// Golden is the fixture's transformers golden (fixtures.LoadVisionGolden).
	Golden *fixtures.VisionGolden
	// Root is the repository root the golden's image paths are relative to.
	Root string
	// Tokenizer decodes golden tokens into the text the server must return.
	Tokenizer *tokenizer.Tokenizer
	// MaxContext is the served context, for the overflow refusal.
	MaxContext int
	// Tolerance bounds |served - transformers| over the first step's top-20 logits of every
	// corpus image (the family's max_abs_logit_diff), read through /mq/v1/logits with the same
	// one-image message; a server without that route gets the greedy check only.
	Tolerance float64
}

func (in VisionInput) check(fn string) error {
	switch {
	case in.API == nil:
		return fmt.Errorf("%s: VisionInput.API is nil", fn)
	case in.Golden == nil:
		return fmt.Errorf("%s: VisionInput.Golden is nil", fn)
	case in.Tokenizer == nil:
		return fmt.Errorf("%s: VisionInput.Tokenizer is nil", fn)
	case !(in.Tolerance > 0):
		return fmt.Errorf("%s: VisionInput.Tolerance %v must be positive (the family's max_abs_logit_diff)", fn, in.Tolerance)
	}
	return nil
}

// ImageDataURL reads an image file as a data: URL (PNG or JPEG by extension).
func ImageDataURL(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	mime := "image/png"
	if strings.HasSuffix(path, ".jpg") || strings.HasSuffix(path, ".jpeg") {
		mime = "image/jpeg"
	}
	return "data:" + mime + ";base64," + base64.StdEncoding.EncodeToString(b), nil
}

// ImageMessage is one user message of an image and a text, as OpenAI content parts.
func ImageMessage(url, text string) map[string]any {
	return map[string]any{"role": "user", "content": []any{
		map[string]any{"type": "image_url", "image_url": map[string]any{"url": url}},
		map[string]any{"type": "text", "text": text},
	}}
}

// VisionRow is one corpus image's outcome.
type VisionRow struct {
	Name, Size, Resized string
	ImageTokens         int
	PromptTokens        int
	Match               bool
	// MaxDiff is max |served - transformers| over the first step's top-20 logits; NaN when
	// the server has no /mq/v1/logits.
	MaxDiff float64
	Detail  string
}

// CheckVisionCorpus is VisionCorpusParity's core: for every golden image, the chat route
// with the image and the golden prompt returns transformers' 32 greedy tokens (as text) and
// reports transformers' prompt token count (the template rendered and the placeholder expanded
// to the image's tokens), and, where the server has /mq/v1/logits, the first step's logits of
// the same message are within in.Tolerance of transformers' top 20 (greedy tokens alone let a
// defect that moves logits but not the argmax of a tiny model through). It returns the
// per-image table.
func CheckVisionCorpus(ctx context.Context, in VisionInput) ([]VisionRow, error) {
	const fn = "spec.CheckVisionCorpus"
	if err := in.check(fn); err != nil {
		return nil, err
	}
	withLogits, err := in.API.HasRoute(ctx, "POST", "/mq/v1/logits")
	if err != nil {
		return nil, fmt.Errorf("%s: probe /mq/v1/logits: %w", fn, err)
	}
	var rows []VisionRow
	pass := 0
	for _, e := range in.Golden.Entries {
		url, err := ImageDataURL(filepath.Join(in.Root, e.Image))
		if err != nil {
			return nil, fmt.Errorf("%s: %w", fn, err)
		}
		r := VisionRow{Name: e.Name, Size: fmt.Sprintf("%dx%d", e.Width, e.Height), Resized: fmt.Sprintf("%dx%d", e.ResizedWidth, e.ResizedHeight), ImageTokens: e.ImageTokens, MaxDiff: math.NaN()}
		logitsDetail := ""
		if withLogits {
			r.MaxDiff, logitsDetail = firstStepDiff(ctx, in, e, url)
		}
		ans, err := in.API.Complete(ctx, "/v1/chat/completions", map[string]any{
			"messages": []any{ImageMessage(url, e.Prompt)}, "max_tokens": len(e.GreedyIDs), "temperature": 0, "ignore_eos": true,
		})
		if err != nil {
			r.Detail = err.Error()
		} else {
			r.PromptTokens = ans.PromptTokens
			want := continuation(in.Tokenizer, e.PromptIDs, e.GreedyIDs)
			switch {
			case ans.PromptTokens != len(e.PromptIDs):
				r.Detail = fmt.Sprintf("prompt tokens %d, transformers %d", ans.PromptTokens, len(e.PromptIDs))
			case ans.Text != want:
				r.Detail = fmt.Sprintf("answer %q, transformers %q", truncate(ans.Text), truncate(want))
			case logitsDetail != "":
				r.Detail = logitsDetail
			case r.MaxDiff > in.Tolerance:
				r.Detail = fmt.Sprintf("first-step logits max |diff| %.3g over the bound %g", r.MaxDiff, in.Tolerance)
			default:
				r.Match = true
				pass++
			}
		}
		rows = append(rows, r)
	}
	if pass != len(rows) {
		var bad []string
		for _, r := range rows {
			if !r.Match {
				bad = append(bad, r.Name+": "+r.Detail)
			}
		}
		return rows, fmt.Errorf("%s: %d/%d images match transformers %s:\n  %s", fn, pass, len(rows), in.Golden.TransformersVersion, strings.Join(bad, "\n  "))
	}
	return rows, nil
}

// firstStepDiff asks /mq/v1/logits for the golden message's logits and returns max |diff|
// over transformers' first-step top 20, or a detail saying why it could not.
func firstStepDiff(ctx context.Context, in VisionInput, e fixtures.VisionEntry, url string) (float64, string) {
	if len(e.FirstTop20IDs) == 0 || len(e.FirstTop20IDs) != len(e.FirstTop20Logits) {
		return math.NaN(), "the golden has no first-step top-20 logits"
	}
	data, vocab, positions, err := in.API.LogitsChat(ctx, []any{ImageMessage(url, e.Prompt)})
	if err != nil {
		return math.NaN(), "logits: " + err.Error()
	}
	if positions != len(e.PromptIDs) {
		return math.NaN(), fmt.Sprintf("logits over %d positions, transformers' prompt has %d", positions, len(e.PromptIDs))
	}
	last := (positions - 1) * vocab
	worst := 0.0
	for j, id := range e.FirstTop20IDs {
		if int(id) >= vocab {
			return math.NaN(), fmt.Sprintf("golden token %d is beyond the served vocabulary %d", id, vocab)
		}
		worst = math.Max(worst, math.Abs(float64(data[last+int(id)])-e.FirstTop20Logits[j]))
	}
	return worst, ""
}

func truncate(s string) string {
	if len(s) > 60 {
		return s[:60] + "..."
	}
	return s
}

// VisionTable renders the corpus table.
func VisionTable(rows []VisionRow) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%-20s %-10s %-10s %-7s %-7s %-6s %s\n", "image", "size", "resized", "tokens", "prompt", "match", "max|diff|")
	n := 0
	for _, r := range rows {
		d := "n/a" // the server has no /mq/v1/logits, or it failed (the row's detail says)
		if !math.IsNaN(r.MaxDiff) {
			d = fmt.Sprintf("%.3g", r.MaxDiff)
		}
		fmt.Fprintf(&b, "%-20s %-10s %-10s %-7d %-7d %-6v %s\n", r.Name, r.Size, r.Resized, r.ImageTokens, r.PromptTokens, r.Match, d)
		if r.Match {
			n++
		}
	}
	fmt.Fprintf(&b, "greedy %d/%d", n, len(rows))
	return b.String()
}

// CheckImageSensitivity: the same question about two different corpus images gets two
// different answers, so a server that dropped or cached the image fails. The first pair of
// golden entries whose greedy tokens differ is used, each image asked its own golden prompt
// and then the other's prompt with its own image swapped in.
func CheckImageSensitivity(ctx context.Context, in VisionInput) error {
	const fn = "spec.CheckImageSensitivity"
	if err := in.check(fn); err != nil {
		return err
	}
	es := in.Golden.Entries
	for i := range es {
		for j := range es {
			if i == j || es[i].Prompt != es[j].Prompt || equalIDs(es[i].GreedyIDs, es[j].GreedyIDs) {
				continue
			}
			var answers [2]string
			for k, e := range []fixtures.VisionEntry{es[i], es[j]} {
				url, err := ImageDataURL(filepath.Join(in.Root, e.Image))
				if err != nil {
					return err
				}
				ans, err := in.API.Complete(ctx, "/v1/chat/completions", map[string]any{
					"messages": []any{ImageMessage(url, es[i].Prompt)}, "max_tokens": 8, "temperature": 0, "ignore_eos": true,
				})
				if err != nil {
					return fmt.Errorf("%s: %s: %w", fn, e.Name, err)
				}
				answers[k] = ans.Text
			}
			if answers[0] == answers[1] {
				return fmt.Errorf("%s: images %s and %s with the same question get the same answer %q (transformers answers differently): the image does not reach the model",
					fn, es[i].Name, es[j].Name, truncate(answers[0]))
			}
			return nil
		}
	}
	return fmt.Errorf("%s: the golden has no two images with the same prompt and different answers", fn)
}

// VisionRefusal is one request the image contract refuses: HTTP 400 whose message names Want.
type VisionRefusal struct {
	Name     string
	Messages []any
	Want     string
}

// VisionRefusals builds the refusal cases of issue 38 from one valid PNG data URL and one
// image whose tokens fill the context together with long text.
func VisionRefusals(png, big string, bigTokens, maxContext int) ([]VisionRefusal, error) {
	img := func(url string) map[string]any {
		return map[string]any{"type": "image_url", "image_url": map[string]any{"url": url}}
	}
	txt := map[string]any{"type": "text", "text": "hi"}
	user := func(parts ...any) map[string]any { return map[string]any{"role": "user", "content": parts} }
	raw, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(png, "data:image/png;base64,"))
	if err != nil || len(raw) < 33 {
		return nil, fmt.Errorf("spec.VisionRefusals: the PNG data URL does not decode")
	}
	// The same PNG declaring 100000 x 100000 pixels in its header (CRC fixed): a
	// decompression bomb, refused before decoding.
	bomb := append([]byte{}, raw...)
	copy(bomb[16:24], []byte{0, 1, 0x86, 0xa0, 0, 1, 0x86, 0xa0})
	crc := crc32.ChecksumIEEE(bomb[12:29])
	copy(bomb[29:33], []byte{byte(crc >> 24), byte(crc >> 16), byte(crc >> 8), byte(crc)})
	long := strings.Repeat(" word", maxContext-bigTokens/2-40)
	b64 := base64.StdEncoding.EncodeToString
	return []VisionRefusal{
		{"a second image in one message", []any{user(img(png), img(png), txt)}, "second image"},
		{"a second image in another message", []any{user(img(png), txt), map[string]any{"role": "assistant", "content": "ok"}, user(img(png), txt)}, "second image"},
		{"an image in a system message", []any{map[string]any{"role": "system", "content": []any{img(png)}}, user(txt)}, "system message"},
		{"an image in an assistant message", []any{user(txt), map[string]any{"role": "assistant", "content": []any{img(png)}}}, "assistant message"},
		{"an https URL", []any{user(img("https://example.com/a.png"), txt)}, "fetches nothing"},
		{"a file URL", []any{user(img("file:///etc/passwd"), txt)}, "fetches nothing"},
		{"a video part", []any{user(map[string]any{"type": "video_url", "video_url": map[string]any{"url": "data:video/mp4;base64,AAAA"}})}, "video_url"},
		{"an audio part", []any{user(map[string]any{"type": "input_audio", "input_audio": map[string]any{"data": "AAAA", "format": "wav"}})}, "input_audio"},
		{"a file part", []any{user(map[string]any{"type": "file", "file": map[string]any{"file_data": "AAAA"}})}, "is not supported"},
		{"detail high", []any{user(map[string]any{"type": "image_url", "image_url": map[string]any{"url": png, "detail": "high"}}, txt)}, "detail"},
		{"empty data", []any{user(img("data:image/png;base64,"), txt)}, "no image data"},
		{"undecodable bytes", []any{user(img("data:image/png;base64,"+b64([]byte("\x89PNG\r\n\x1a\nnot a png"))), txt)}, "does not decode"},
		{"a declared type that disagrees", []any{user(img(strings.Replace(png, "image/png", "image/jpeg", 1)), txt)}, "disagrees"},
		{"a decompression bomb", []any{user(img("data:image/png;base64,"+b64(bomb)), txt)}, "before decoding"},
		{"image tokens overflowing the context", []any{user(img(big), map[string]any{"type": "text", "text": long})}, "context"},
	}, nil
}

// CheckVisionRefusals is VisionRefusalContract's core: every case gets HTTP 400 naming its
// reason, and the next valid image request gets 200.
func CheckVisionRefusals(ctx context.Context, in VisionInput) error {
	const fn = "spec.CheckVisionRefusals"
	if err := in.check(fn); err != nil {
		return err
	}
	var small, big *fixtures.VisionEntry
	for i := range in.Golden.Entries {
		e := &in.Golden.Entries[i]
		if strings.HasSuffix(e.Image, ".png") && (small == nil || e.ImageTokens < small.ImageTokens) {
			small = e
		}
		if big == nil || e.ImageTokens > big.ImageTokens {
			big = e
		}
	}
	if small == nil {
		return fmt.Errorf("%s: the golden has no PNG image", fn)
	}
	png, err := ImageDataURL(filepath.Join(in.Root, small.Image))
	if err != nil {
		return err
	}
	bigURL, err := ImageDataURL(filepath.Join(in.Root, big.Image))
	if err != nil {
		return err
	}
	cases, err := VisionRefusals(png, bigURL, big.ImageTokens, in.MaxContext)
	if err != nil {
		return err
	}
	var problems []string
	for _, c := range cases {
		_, err := in.API.Complete(ctx, "/v1/chat/completions", map[string]any{"messages": c.Messages, "max_tokens": 4})
		var ae *APIError
		switch {
		case err == nil:
			problems = append(problems, fmt.Sprintf("%s: accepted (200), want 400", c.Name))
		case !errors.As(err, &ae) || ae.Status != 400 || !strings.Contains(ae.Message, c.Want):
			problems = append(problems, fmt.Sprintf("%s: %v; want 400 naming %q", c.Name, err, c.Want))
		}
		if _, err := in.API.Complete(ctx, "/v1/chat/completions", map[string]any{
			"messages": []any{ImageMessage(png, small.Prompt)}, "max_tokens": 2, "temperature": 0,
		}); err != nil {
			problems = append(problems, fmt.Sprintf("the valid request after %s failed: %v", c.Name, err))
		}
	}
	if len(problems) > 0 {
		return fmt.Errorf("%s: %d of %d refusal checks failed:\n  %s", fn, len(problems), len(cases), strings.Join(problems, "\n  "))
	}
	return nil
}

// ImageFingerprints hashes the golden's image files (sha256 by path), checking each against
// the golden's own hash: a changed corpus image fails the run.
func ImageFingerprints(root string, g *fixtures.VisionGolden) (map[string]string, error) {
	out := map[string]string{}
	for _, e := range g.Entries {
		b, err := os.ReadFile(filepath.Join(root, e.Image))
		if err != nil {
			return nil, err
		}
		s := sha256.Sum256(b)
		h := hex.EncodeToString(s[:])
		if h != e.ImageBytesSHA256 {
			return nil, fmt.Errorf("corpus image %s hashes to %s, the golden was made from %s: the image changed", e.Image, h, e.ImageBytesSHA256)
		}
		out[e.Image] = h
	}
	return out, nil
}

// VisionGates registers the vision-language gates: the corpus against transformers (with
// the image corpus fingerprinted before and after), image sensitivity, streaming equal to
// non-streaming for an image request, and the refusal contract.
func VisionGates(ctx context.Context, input func() VisionInput) {
	ginkgo.It("answers with one image as transformers does on the image corpus (greedy tokens, prompt tokens, first-step logits), image files unchanged", Gate(GateParity), Task(TaskVision), Task(TaskChat), func(sctx ginkgo.SpecContext) {
		c, cancel := specContext(ctx, sctx)
		defer cancel()
		in := input()
		before, err := ImageFingerprints(in.Root, in.Golden)
		gomega.Expect(err).NotTo(gomega.HaveOccurred())
		rows, err := CheckVisionCorpus(c, in)
		if rows != nil {
			ginkgo.AddReportEntry("vision corpus", VisionTable(rows))
		}
		after, ferr := ImageFingerprints(in.Root, in.Golden)
		gomega.Expect(ferr).NotTo(gomega.HaveOccurred(), "the image corpus changed during the run")
		gomega.Expect(after).To(gomega.Equal(before), "the image corpus changed during the run")
		gomega.Expect(err).NotTo(gomega.HaveOccurred())
	})
	ginkgo.It("changes its answer when the image changes", Gate(GateParity), Task(TaskVision), func(sctx ginkgo.SpecContext) {
		c, cancel := specContext(ctx, sctx)
		defer cancel()
		gomega.Expect(CheckImageSensitivity(c, input())).To(gomega.Succeed())
	})
	ginkgo.It("streams an image answer whose deltas concatenate to the non-streaming answer", Gate(GateParity), Task(TaskVision), Task(TaskStream), func(sctx ginkgo.SpecContext) {
		c, cancel := specContext(ctx, sctx)
		defer cancel()
		in := input()
		e := in.Golden.Entries[0]
		url, err := ImageDataURL(filepath.Join(in.Root, e.Image))
		gomega.Expect(err).NotTo(gomega.HaveOccurred())
		body := map[string]any{"messages": []any{ImageMessage(url, e.Prompt)}, "max_tokens": 16, "temperature": 0, "ignore_eos": true}
		whole, err := in.API.Complete(c, "/v1/chat/completions", body)
		gomega.Expect(err).NotTo(gomega.HaveOccurred())
		body["stream"] = true
		streamed, err := in.API.Complete(c, "/v1/chat/completions", body)
		gomega.Expect(err).NotTo(gomega.HaveOccurred())
		gomega.Expect(strings.Join(streamed.Deltas, "")).To(gomega.Equal(whole.Text))
		gomega.Expect(whole.Text).NotTo(gomega.BeEmpty())
	})
	ginkgo.It("refuses what the image contract excludes with 400 naming the reason, and answers the next request", Gate(GateContract), Task(TaskVision), func(sctx ginkgo.SpecContext) {
		c, cancel := specContext(ctx, sctx)
		defer cancel()
		gomega.Expect(CheckVisionRefusals(c, input())).To(gomega.Succeed())
	})
}
