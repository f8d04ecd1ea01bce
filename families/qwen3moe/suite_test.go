package qwen3moe_test

import (
	"testing"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/modelqual/modelqual/families/qwen3moe/reference"
	"github.com/modelqual/modelqual/qual/spec"
)

func TestQwen3Moe(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "qwen3moe family")
}

// suite is the one server, checkpoint and bundle every qwen3moe spec uses.
var suite = spec.NewSuite(spec.SuiteInput{
	Family: "qwen3moe",
	Reference: func(dir string) (spec.Reference, error) {
		return reference.Load(dir)
	},
})
