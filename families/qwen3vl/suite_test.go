package qwen3vl_test

import (
	"errors"
	"testing"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/modelqual/modelqual/qual/spec"
)

func TestQwen3VL(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "qwen3vl family")
}

// suite is the one server, checkpoint and bundle every qwen3vl spec uses. The family has no Go
// reference forward pass: its references are transformers' goldens.
var suite = spec.NewSuite(spec.SuiteInput{
	Family: "qwen3vl",
	Reference: func(string) (spec.Reference, error) {
		return nil, errors.New("qwen3vl has no Go reference forward pass; its gates compare with transformers' goldens")
	},
})
