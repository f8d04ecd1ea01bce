package qwen_test

import (
	"testing"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/modelqual/modelqual/families/qwen/reference"
	"github.com/modelqual/modelqual/qual/spec"
)

func TestQwen(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "qwen family")
}

// suite is the one server, checkpoint and bundle every qwen spec uses.
var suite = spec.NewSuite(spec.SuiteInput{
	Family: "qwen",
	Reference: func(dir string) (spec.Reference, error) {
		return reference.Load(dir)
	},
})
