package internvl_test

import (
	"errors"
	"io/fs"
	"os"
	"testing"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/modelqual/modelqual/fixtures"
	"github.com/modelqual/modelqual/qual/spec"
)

func TestInternVL(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "internvl family")
}

// suite is the one server, checkpoint and bundle every internvl spec uses. The family has no Go
// reference forward pass: its references are transformers' goldens.
var suite = spec.NewSuite(spec.SuiteInput{
	Family: "internvl",
	Reference: func(string) (spec.Reference, error) {
		return nil, errors.New("internvl has no Go reference forward pass; its gates compare with transformers' goldens")
	},
})

// goldenPath is the fixture's transformers golden. Until the first run of
// fixtures/golden/run_internvl_golden.sh on a host with transformers 5.17 has made it, the
// specs that compare with it skip, each saying so (never passing on nothing); a golden that
// exists but does not load fails them.
func goldenPath() string {
	p := fixtures.VisionGoldenPath(suite.State.RepoRoot, suite.Manifest.Checkpoint.Fixture)
	if _, err := os.Stat(p); errors.Is(err, fs.ErrNotExist) {
		Skip("NO GOLDEN: " + p + " is missing, so this parity spec has nothing to compare with; make it with fixtures/golden/run_internvl_golden.sh (transformers 5.17, CPU fp32) and commit it")
	}
	return p
}
