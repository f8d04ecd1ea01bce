package spec

import (
	"context"
	"path/filepath"
	"strconv"
	"time"

	"github.com/onsi/ginkgo/v2"
	"github.com/onsi/gomega"
)

// Inputs of the gates that check generation's edges (end of sequence, stop strings, chat
// usage, concurrency, failure records) for this suite.

// goldenFixture is the fixture name the suite's goldens are filed under.
func (s *Suite) goldenFixture() string {
	if f := s.Manifest.Checkpoint.Fixture; f != "" {
		return f
	}
	return filepath.Base(s.Manifest.Checkpoint.ID)
}

// EOSInput is the natural-EOS gate's input: fixtures/golden/<fixture>-eos.json.
func (s *Suite) EOSInput() EOSInput {
	return EOSInput{API: s.API, Path: filepath.Join(s.State.RepoRoot, "fixtures", "golden", s.goldenFixture()+"-eos.json"),
		CheckpointDir: s.State.Checkpoint, Tokenizer: s.Tokenizer, TieMargin: s.tieMargin()}
}

// StopInput is the stop-string gate's input: the fixture's transformers golden.
func (s *Suite) StopInput() StopInput {
	return StopInput{API: s.API, Path: GoldenPath(s.State.RepoRoot, s.goldenFixture()), Tokenizer: s.Tokenizer, TieMargin: s.tieMargin(),
		RequireVendor: s.State.Launcher != "external"}
}

// tieMargin is the GPU thresholds' greedy_tie_margin on a cuda run, else 0 (exact).
func (s *Suite) tieMargin() float64 {
	if s.State.Device != "cuda" {
		return 0
	}
	return s.Threshold().GreedyTieMargin
}

// ChatUsageInput is the chat usage gate's input: the renderings under key of
// fixtures/golden/<file>, and the server's records when the harness can read them.
func (s *Suite) ChatUsageInput(file, key string) ChatUsageInput {
	gs, err := LoadChatGoldens(filepath.Join(s.State.RepoRoot, "fixtures", "golden", file), key)
	gomega.Expect(err).NotTo(gomega.HaveOccurred())
	return ChatUsageInput{API: s.API, Goldens: gs, RecordsPath: s.State.RecordsPath}
}

// ConcurrentInput is the concurrency gate's input: the whole corpus, 16 requests in flight.
func (s *Suite) ConcurrentInput() ConcurrentInput {
	return ConcurrentInput{API: s.API, Tokenizer: s.Tokenizer, Corpus: s.Corpus, Requests: 16, MaxTokens: 32, TieMargin: s.tieMargin()}
}

// FailureRecordsInput starts a second server of the suite's bundle with a short request
// timeout (FailureRequestTimeout of the long request's time on the suite's server: a tiny model
// on a fast machine answers a whole context in under 100 ms), one batch slot and a queue of
// one, and returns the failure-records gate's input for it. Like StartServer, it skips the spec
// under the external launcher.
func (s *Suite) FailureRecordsInput() FailureRecordsInput {
	ginkgo.GinkgoHelper()
	timeout := 100 * time.Millisecond
	if s.State.Bundle != "" {
		long, err := TimeLongRequest(context.Background(), s.API, s.Manifest.Build.MaxContext)
		gomega.Expect(err).NotTo(gomega.HaveOccurred())
		timeout = FailureRequestTimeout(long)
		ginkgo.GinkgoWriter.Printf("failure records: the long request takes %v on the suite's server; --request-timeout %v\n", long, timeout)
	}
	api, ep := s.StartServerArgs(context.Background(), []string{"--request-timeout", timeout.String(), "--max-batch", "1", "--queue-depth", strconv.Itoa(1)})
	return FailureRecordsInput{API: api, RecordsPath: ep.RecordsPath, MaxContext: s.Manifest.Build.MaxContext, RequestTimeout: timeout}
}

// TokenizerInput is the tokenizer gate's input: the texts under key of
// fixtures/golden/tokenizer_golden.json.
func (s *Suite) TokenizerInput(key string) TokenizerInput {
	return TokenizerInput{API: s.API, Path: filepath.Join(s.State.RepoRoot, "fixtures", "golden", "tokenizer_golden.json"), Key: key}
}
