package internvl_test

import (
	"fmt"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/modelqual/modelqual/fixtures"
	"github.com/modelqual/modelqual/qual/spec"
)

// The GPU side of the several-images contract (the single-image gates run on the GPU through
// suite.Qualify's "internvl on GPU"): the two-image requests of the golden served by the cuda
// bundle (native/models/internvl.cu, tiles of both images stacked in one engine input) with
// --max-images-per-request 2. The prompt must be transformers' token for token; the answer's
// first greedy_steps tokens of the gpu: block must equal the fp32 golden's on at least the share
// of requests the gpu: block asks of the single-image corpus (corpus_min_pass of its entries,
// rounded down): bf16 rounding may break a near-tie of a random-weight model either way. Without
// a GPU the spec skips with NVML's reason (spec.Suite.RequireGPU).
var _ = Describe("internvl with several images on GPU", suite.Labels(), spec.GPU(), spec.Task(spec.TaskVision), spec.Gate(spec.GateParity), func() {
	BeforeEach(func() { suite.RequireGPU() })
	It("answers two-image requests with transformers' prompt tokens and, on the gpu share of them, its greedy tokens", func(ctx SpecContext) {
		root := suite.State.RepoRoot
		pairs := loadPairs()
		th := suite.Threshold()
		g, err := fixtures.LoadVisionGolden(goldenPath())
		Expect(err).NotTo(HaveOccurred())
		Expect(g.Entries).NotTo(BeEmpty())
		Expect(th.GreedySteps).To(BeNumerically(">", 0), "thresholds.yaml gpu: greedy_steps")
		need := len(pairs) * th.CorpusMinPass / len(g.Entries)
		api, _ := suite.StartServerArgs(ctx, []string{"--max-images-per-request", "2"})
		pass := 0
		var problems []string
		for _, p := range pairs {
			Expect(p.Error).To(BeEmpty(), "transformers failed on %s", p.Name)
			steps := min(th.GreedySteps, len(p.GreedyIDs))
			ans, err := api.Complete(ctx, "/v1/chat/completions", map[string]any{
				"messages": []any{pairMessage(root, p.Images, p.Prompt)}, "max_tokens": steps, "temperature": 0, "ignore_eos": true,
			})
			Expect(err).NotTo(HaveOccurred(), p.Name)
			Expect(ans.PromptTokens).To(Equal(len(p.PromptIDs)), "%s: prompt tokens differ from transformers'", p.Name)
			if want := suite.Tokenizer.Decode(p.GreedyIDs[:steps]); ans.Text == want {
				pass++
			} else {
				problems = append(problems, fmt.Sprintf("%s: answer %q, transformers %q", p.Name, ans.Text, want))
			}
		}
		AddReportEntry("two-image requests on GPU", fmt.Sprintf("%d/%d match transformers' first %d greedy tokens (need %d)", pass, len(pairs), th.GreedySteps, need))
		Expect(pass).To(BeNumerically(">=", max(need, 1)), "%v", problems)
	})
})
