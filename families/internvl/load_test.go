package internvl_test

import (
	"context"

	. "github.com/onsi/ginkgo/v2"
)

// One spec per manifest profile; the manifest's premerge flag decides premerge or slow.
var _ = Describe("internvl load", suite.Labels(), func() {
	suite.LoadProfiles(context.Background())
})
