package internvl_test

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/modelqual/modelqual/fixtures"
	"github.com/modelqual/modelqual/qual/spec"
)

// pairGolden is a two-image request of the golden (make_internvl_golden.py --pairs).
type pairGolden struct {
	Name      string   `json:"name"`
	Images    []string `json:"images"`
	Prompt    string   `json:"prompt"`
	PromptIDs []int32  `json:"prompt_ids"`
	GreedyIDs []int32  `json:"greedy_ids"`
	Error     string   `json:"error"`
}

func loadPairs() []pairGolden {
	b, err := os.ReadFile(goldenPath())
	Expect(err).NotTo(HaveOccurred())
	var g struct {
		Pairs []pairGolden `json:"pairs"`
	}
	Expect(json.Unmarshal(b, &g)).To(Succeed())
	Expect(g.Pairs).NotTo(BeEmpty(), "the golden has no two-image requests")
	return g.Pairs
}

func pairMessage(root string, images []string, text string) map[string]any {
	var parts []any
	for _, p := range images {
		url, err := spec.ImageDataURL(filepath.Join(root, p))
		Expect(err).NotTo(HaveOccurred())
		parts = append(parts, map[string]any{"type": "image_url", "image_url": map[string]any{"url": url}})
	}
	parts = append(parts, map[string]any{"type": "text", "text": text})
	return map[string]any{"role": "user", "content": parts}
}

// Several images per request (qual-server --max-images-per-request 2): each image's tiles and
// <img> ... </img> run where its content part stands, as transformers' InternVLProcessor lays
// them out; a third image is refused naming the flag; and the corpus gate bites on a planted
// pixel-shuffle defect.
var _ = Describe("internvl with several images and planted defects", suite.Labels(), spec.Premerge(), func() {
	It("refuses what the image contract excludes with 400 naming the reason, before any golden exists (corpus images sized by the served /tokenize)", spec.Task(spec.TaskVision), spec.Gate(spec.GateContract), func(ctx SpecContext) {
		root := suite.State.RepoRoot
		if _, err := os.Stat(fixtures.VisionGoldenPath(root, suite.Manifest.Checkpoint.Fixture)); err == nil {
			Skip("the golden exists: the vision gates' refusal spec runs the same contract with transformers' token counts")
		}
		b, err := os.ReadFile(filepath.Join(root, "families", "internvl", "corpus.jsonl"))
		Expect(err).NotTo(HaveOccurred())
		var es []fixtures.VisionEntry
		for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			var e fixtures.VisionEntry
			Expect(json.Unmarshal([]byte(line), &e)).To(Succeed())
			url, err := spec.ImageDataURL(filepath.Join(root, e.Image))
			Expect(err).NotTo(HaveOccurred())
			tk, err := suite.API.TokenizeChat(ctx, spec.Prompt{Messages: []map[string]any{spec.ImageMessage(url, e.Prompt)}, AddGenerationPrompt: true})
			Expect(err).NotTo(HaveOccurred(), e.Name)
			e.ImageTokens = tk.Count // the image's tokens and a few of text: enough to size the overflow case
			es = append(es, e)
		}
		Expect(spec.CheckVisionRefusals(ctx, spec.VisionInput{API: suite.API, Golden: &fixtures.VisionGolden{Entries: es}, Root: root,
			Tokenizer: suite.Tokenizer, MaxContext: suite.Manifest.Build.MaxContext, Tolerance: suite.Threshold().MaxAbsLogitDiff})).To(Succeed())
	})

	It("answers two-image requests as transformers does (prompt tokens, greedy tokens) and refuses a third image naming the flag", spec.Task(spec.TaskVision), spec.Task(spec.TaskChat), spec.Gate(spec.GateParity), func(ctx SpecContext) {
		root := suite.State.RepoRoot
		pairs := loadPairs()
		api, _ := suite.StartServerArgs(ctx, []string{"--max-images-per-request", "2"})
		var problems []string
		for _, p := range pairs {
			Expect(p.Error).To(BeEmpty(), "transformers failed on %s", p.Name)
			ans, err := api.Complete(ctx, "/v1/chat/completions", map[string]any{
				"messages": []any{pairMessage(root, p.Images, p.Prompt)}, "max_tokens": len(p.GreedyIDs), "temperature": 0, "ignore_eos": true,
			})
			Expect(err).NotTo(HaveOccurred(), p.Name)
			want := suite.Tokenizer.Decode(p.GreedyIDs)
			switch {
			case ans.PromptTokens != len(p.PromptIDs):
				problems = append(problems, p.Name+": prompt tokens differ from transformers'")
			case ans.Text != want:
				problems = append(problems, p.Name+": answer "+ans.Text+", transformers "+want)
			}
		}
		Expect(problems).To(BeEmpty())
		three := append(append([]string{}, pairs[0].Images...), pairs[0].Images[0])
		_, err := api.Complete(ctx, "/v1/chat/completions", map[string]any{"messages": []any{pairMessage(root, three, "Three?")}, "max_tokens": 1})
		var ae *spec.APIError
		Expect(errors.As(err, &ae)).To(BeTrue(), "a third image: %v", err)
		Expect(ae.Status).To(Equal(400))
		Expect(ae.Message).To(ContainSubstring("--max-images-per-request"))
	})

	It("the corpus gate fails when pixel shuffle swaps rows and columns (internvl.shuffle_transposed)", spec.Task(spec.TaskVision), spec.Gate(spec.GateParity), func(ctx SpecContext) {
		root := suite.State.RepoRoot
		g, err := fixtures.LoadVisionGolden(goldenPath())
		Expect(err).NotTo(HaveOccurred())
		api, _ := suite.StartServer(ctx, "MODELQUAL_FAULTS=internvl.shuffle_transposed")
		g.Entries = g.Entries[:2]
		_, err = spec.CheckVisionCorpus(ctx, spec.VisionInput{API: api, Golden: g, Root: root, Tokenizer: suite.Tokenizer,
			MaxContext: suite.Manifest.Build.MaxContext, Tolerance: suite.Threshold().MaxAbsLogitDiff})
		Expect(err).To(HaveOccurred())
		AddReportEntry("the gate's message", err.Error())
		Expect(strings.Contains(err.Error(), "0/2 images match")).To(BeTrue(), err.Error())
	})
})
