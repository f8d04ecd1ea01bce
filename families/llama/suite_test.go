package llama_test

import (
	"testing"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/modelqual/modelqual/families/llama/reference"
	"github.com/modelqual/modelqual/qual/spec"
)

func TestLlama(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "llama family")
}

// suite is the one server, checkpoint and bundle every llama spec uses.
var suite = spec.NewSuite(spec.SuiteInput{
	Family: "llama",
	Reference: func(dir string) (spec.Reference, error) {
		return reference.Load(dir)
	},
})
