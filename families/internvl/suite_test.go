package internvl_test

import (
	"errors"
	"testing"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

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
