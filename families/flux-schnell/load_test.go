package fluxschnell_test

import (
	"context"

	. "github.com/onsi/ginkgo/v2"
)

// One spec per manifest profile (the images profile over images.jsonl); the manifest's
// premerge flag decides premerge or slow.
var _ = Describe("flux-schnell load", fluxLabel, suite.Labels(), func() {
	suite.LoadProfiles(context.Background())
})
