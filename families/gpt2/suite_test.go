package gpt2_test

import (
	"testing"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/modelqual/modelqual/families/gpt2/reference"
	"github.com/modelqual/modelqual/qual/spec"
)

func TestGPT2(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "gpt2 family")
}

// suite is the one server, checkpoint and bundle every gpt2 spec uses.
var suite = spec.NewSuite(spec.SuiteInput{
	Family: "gpt2",
	Reference: func(dir string) (spec.Reference, error) {
		return reference.Load(dir)
	},
})
