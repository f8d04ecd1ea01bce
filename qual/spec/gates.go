package spec

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/onsi/ginkgo/v2"
	"github.com/onsi/gomega"

	"github.com/modelqual/modelqual/qual/gpu"
	"github.com/modelqual/modelqual/qual/provenance"
	"github.com/modelqual/modelqual/server/envconfig"
)

// The reusable gates. Each is called inside a family's Describe, takes an input getter that
// runs when the spec runs (after the suite's setup filled the Suite), checks its input naming
// the field and the function, and asserts on the gate's plain core function.

// specContext joins the parent context given to a gate with the spec's own (which carries
// Ginkgo's timeouts and interrupts): either ending cancels the work.
func specContext(parent context.Context, sctx ginkgo.SpecContext) (context.Context, context.CancelFunc) {
	if parent == nil {
		parent = context.Background()
	}
	ctx, cancel := context.WithCancel(parent)
	stop := context.AfterFunc(sctx, cancel)
	return ctx, func() { stop(); cancel() }
}

// BundleProvenance asserts that the served bundle is the one the manifest names.
func BundleProvenance(ctx context.Context, input func() ProvenanceInput) {
	ginkgo.It("serves the bundle the manifest names (checkpoint, immutable revision, precision, context)", Gate(GateProvenance), func(sctx ginkgo.SpecContext) {
		c, cancel := specContext(ctx, sctx)
		defer cancel()
		in := input()
		requireCapability(c, in.API, CapMQBundle)
		passGate(CheckProvenance(c, in))
	})
}

// ParityGate asserts that served greedy tokens and logits equal the family reference on the
// corpus (CheckParity), and attaches the per-prompt outcome to the report.
func ParityGate(ctx context.Context, input func() ParityInput) {
	ginkgo.It("matches the family reference on the corpus (greedy tokens exact, logits within thresholds)", Gate(GateParity), Task(TaskText), func(sctx ginkgo.SpecContext) {
		c, cancel := specContext(ctx, sctx)
		defer cancel()
		in := input()
		requireCapability(c, in.API, CapMQLogits)
		res, err := CheckParity(c, in)
		if res != nil {
			ginkgo.AddReportEntry("parity", res.Summary())
			ginkgo.AddReportEntry("parity per prompt", parityTable(res), ginkgo.ReportEntryVisibilityFailureOrVerbose)
		}
		passGate(err)
	})
}

// GoldenParity asserts that the served model matches the upstream implementation's golden
// outputs (CheckGolden).
func GoldenParity(ctx context.Context, input func() GoldenInput) {
	ginkgo.It("matches the transformers golden (greedy tokens exact, top-5 logits within thresholds)", Gate(GateParity), Task(TaskText), func(sctx ginkgo.SpecContext) {
		c, cancel := specContext(ctx, sctx)
		defer cancel()
		in := input()
		if in.API != nil {
			if caps, err := in.API.Capabilities(c); err == nil && !caps.MQLogits {
				// Another server: token-level parity through OpenAI logprobs where it offers
				// them (values too when the golden has top5_logprobs).
				passGate(goldenThroughLogprobs(c, in))
				return
			}
		}
		requireCapability(c, in.API, CapMQLogits)
		passGate(CheckGolden(c, in))
	})
}

// StreamingParity asserts that streamed deltas concatenate to the non-streaming answer.
func StreamingParity(ctx context.Context, input func() StreamingInput) {
	ginkgo.It("streams deltas that concatenate to the non-streaming answer, with equal token counts", Gate(GateParity), Task(TaskStream), func(sctx ginkgo.SpecContext) {
		c, cancel := specContext(ctx, sctx)
		defer cancel()
		passGate(CheckStreaming(c, input()))
	})
}

// ChatTemplateParity asserts that the served chat prompt renders as the checkpoint's own
// template does in transformers.
func ChatTemplateParity(ctx context.Context, input func() ChatTemplateInput) {
	ginkgo.It("renders chat prompts exactly as the checkpoint's template in transformers", Gate(GateParity), Task(TaskChat), func(sctx ginkgo.SpecContext) {
		c, cancel := specContext(ctx, sctx)
		defer cancel()
		in := input()
		requireCapability(c, in.API, CapTokenizeChat)
		passGate(CheckChatTemplate(c, in))
	})
}

// ContextContract asserts the capacity contract and that unsupported controls are refused.
func ContextContract(ctx context.Context, input func() ContextInput) {
	ginkgo.It("refuses over-context requests with 400, then serves the next one; refuses unsupported controls by name", Gate(GateContract), Task(TaskText), func(sctx ginkgo.SpecContext) {
		c, cancel := specContext(ctx, sctx)
		defer cancel()
		passGate(CheckContext(c, input()))
	})
}

// LoadProfile runs one load profile (warmup, then its sweep) and asserts CheckLoad; the
// headline percentiles, throughputs and HTTP−task overhead become report entries, and the run
// directories are named in the report. Load specs are Serial: they run alone, after the
// parallel specs, so their figures are not disturbed by other gates.
func LoadProfile(ctx context.Context, name string, input func() LoadInput, decorators ...any) {
	args := append([]any{Gate(GateLoad), ginkgo.Serial}, decorators...)
	args = append(args, func(sctx ginkgo.SpecContext) {
		c, cancel := specContext(ctx, sctx)
		defer cancel()
		res, err := CheckLoad(c, input())
		if res != nil {
			// One structured entry (qual qualify and other tools read it from the JSON report)
			// and one table for people.
			ginkgo.AddReportEntry(LoadFiguresEntry, res.Figures, ginkgo.ReportEntryVisibilityNever)
			for _, f := range res.Figures {
				// One JUnit property per figure, e.g. "completions-closed concurrency=1 mq_http_latency.p95 [ms]".
				ginkgo.AddReportEntry(fmt.Sprintf("%s %s %s [%s]", f.Profile, f.Point, f.Name, f.Unit), f.Value, ginkgo.ReportEntryVisibilityNever)
			}
			ginkgo.AddReportEntry("load figures table", figureTable(res.Figures), ginkgo.ReportEntryVisibilityFailureOrVerbose)
			if len(res.Dirs) > 0 {
				ginkgo.AddReportEntry("run directories", strings.Join(res.Dirs, "\n"), ginkgo.ReportEntryVisibilityFailureOrVerbose)
			}
			if len(res.Verified) > 0 {
				ginkgo.AddReportEntry("figures recomputed from the raw records", strings.Join(res.Verified, "\n"))
			}
		}
		passGate(err)
	})
	ginkgo.It("sustains load profile "+name+" with zero errors and zero unmatched request IDs", args...)
}

// LoadProfiles declares one LoadProfile per manifest profile, labelled premerge or slow as
// the manifest says.
func (s *Suite) LoadProfiles(ctx context.Context) {
	for _, p := range s.Manifest.Profiles {
		placement := Slow()
		if p.Premerge {
			placement = Premerge()
		}
		name := p.Name
		LoadProfile(ctx, name, func() LoadInput { return s.LoadInput(name) }, placement)
	}
}

// LoadFiguresEntry names the report entry holding a load gate's []Figure.
const LoadFiguresEntry = "load figures"

func figureTable(fs []Figure) string {
	var b strings.Builder
	for _, f := range fs {
		fmt.Fprintf(&b, "%-14s %-36s %12.4g %s\n", f.Point, f.Name, f.Value, f.Unit)
	}
	return b.String()
}

func parityTable(r *ParityResult) string {
	var b strings.Builder
	for _, p := range r.Prompts {
		status := "pass"
		if !p.Passed() {
			status = "FAIL: " + strings.Join(p.Problems, "; ")
		}
		fmt.Fprintf(&b, "%-28s %4d tokens  max|Δ| %.3g  %s\n", p.Name, p.PromptTokens, p.MaxAbsDiff, status)
	}
	return b.String()
}

// ProvenanceInput is the provenance gate's input for this suite.
func (s *Suite) ProvenanceInput() ProvenanceInput {
	// The manifest the bundle was built from: a GPU run's asks for the cuda backend.
	return ProvenanceInput{API: s.API, Manifest: s.buildManifest(s.State), BundleDigest: s.State.BundleDigest, CheckpointDir: s.State.Checkpoint}
}

// ParityInput is the parity gate's input for this suite: the whole corpus, the family
// reference and the backend's thresholds. It fails the spec when the reference cannot load.
func (s *Suite) ParityInput() ParityInput {
	ref, err := s.Reference()
	gomega.Expect(err).NotTo(gomega.HaveOccurred(), "load the %s reference", s.Family)
	return ParityInput{API: s.API, Reference: ref, Tokenizer: s.Tokenizer, Corpus: s.Corpus,
		Thresholds: s.Threshold(), MaxContext: s.Manifest.Build.MaxContext}
}

// GoldenInput is the golden gate's input for this suite: fixtures/golden/<fixture>.json.
func (s *Suite) GoldenInput() GoldenInput {
	fixture := s.Manifest.Checkpoint.Fixture
	if fixture == "" {
		fixture = filepath.Base(s.Manifest.Checkpoint.ID)
	}
	in := GoldenInput{API: s.API, Path: GoldenPath(s.State.RepoRoot, fixture), Revision: s.Manifest.Checkpoint.Revision,
		Tokenizer: s.Tokenizer, Corpus: s.Corpus}
	if s.State.Device == "cuda" {
		// The golden is transformers in float32; a bf16 engine drifts from it within the gpu
		// tolerance and may take another greedy path after a while.
		t := s.Threshold()
		in.Tolerance, in.MaxSteps, in.TieMargin = t.MaxAbsLogitDiff, t.GreedySteps, t.GreedyTieMargin
	}
	return in
}

// StreamingInput is the streaming gate's input for this suite: prompts of the given kind
// (chat conversations when chat is true, raw prompts otherwise), answers of greedy_steps tokens.
func (s *Suite) StreamingInput(chat bool) StreamingInput {
	var ps []Prompt
	for _, p := range s.Corpus {
		if p.IsChat() == chat {
			ps = append(ps, p)
		}
	}
	return StreamingInput{API: s.API, Corpus: ps, MaxTokens: s.Threshold().GreedySteps, OpenAIOnly: s.State.Launcher == "external"}
}

// ChatTemplateInput is the chat template gate's input: the renderings under key of
// fixtures/golden/tokenizer_golden.json.
func (s *Suite) ChatTemplateInput(key string) ChatTemplateInput {
	gs, err := LoadChatGoldens(filepath.Join(s.State.RepoRoot, "fixtures", "golden", "tokenizer_golden.json"), key)
	gomega.Expect(err).NotTo(gomega.HaveOccurred())
	return ChatTemplateInput{API: s.API, Goldens: gs}
}

// ContextInput is the context contract's input: the manifest's max_context and the default
// refused controls.
func (s *Suite) ContextInput() ContextInput {
	return ContextInput{API: s.API, MaxContext: s.Manifest.Build.MaxContext, Refused: DefaultRefusedControls(),
		OpenAIOnly: s.State.Launcher == "external"}
}

// LoadInput is the load gate's input for the manifest profile name.
func (s *Suite) LoadInput(name string) LoadInput {
	p, ok := s.Manifest.Profile(name)
	gomega.Expect(ok).To(gomega.BeTrue(), "profile %q is not in %s", name, s.Manifest.Path())
	in := LoadInput{Endpoint: s.Endpoint, Profile: p, Tokenizer: s.Tokenizer, InputFile: s.Manifest.InputPath(p), ImageDir: s.Manifest.ImageDir(p), OutDir: s.ArtifactDir("load"),
		RequestTimeout: s.Manifest.Server.RequestTimeout.Duration, Fingerprint: s.fingerprint()}
	if s.State.Device == "cuda" {
		in.GPUIndices, in.RequireGPU = gpu.Indices(s.GPUs), true
		in.OutDir = s.ArtifactDir("load-gpu")
	}
	return in
}

func (s *Suite) fingerprint() provenance.Spec {
	fp := provenance.Spec{Bundle: s.State.Bundle, Inputs: []string{s.CorpusPath}, TokenizerDir: s.State.Checkpoint}
	if s.State.Launcher != "external" && !envconfig.NoSourceFinger.Bool() {
		fp.SourceRoot = s.State.RepoRoot
		fp.Exclude = []string{s.State.Artifacts}
	}
	return fp
}

// passGate fails the calling spec with the gate's own error text as the failure message, so
// the first line of a JUnit <failure> (what CI pages show) says why the gate failed, not
// gomega's "Unexpected error:" with the reason further down.
func passGate(err error) {
	if err != nil {
		ginkgo.GinkgoHelper()
		ginkgo.Fail(err.Error())
	}
}

// NotCheckable starts the skip reason of a gate the engine offers no way to check: the
// qualify summary reports such a gate as "not checkable on this engine".
const NotCheckable = "not checkable on this engine: "

// requireCapability skips the calling spec when the server lacks a capability (Capabilities):
// an extension route of qual-server, vLLM or llama.cpp that another OpenAI-compatible server
// need not offer is "not checkable on this engine", never a failure.
func requireCapability(ctx context.Context, api *API, name string) {
	ginkgo.GinkgoHelper()
	if api == nil {
		return // the gate's input check names the missing API
	}
	caps, err := api.Capabilities(ctx)
	if err != nil {
		ginkgo.Fail(fmt.Sprintf("probe what the server at %s offers: %v", api.BaseURL, err))
	}
	if why, missing := caps.Missing[name]; missing {
		ginkgo.Skip(fmt.Sprintf("%sneeds %s, which the server at %s lacks: %s", NotCheckable, name, api.BaseURL, why))
	}
}
