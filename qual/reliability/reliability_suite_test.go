// Package reliability is qual-server's reliability suite (make reliability, Ginkgo label
// "reliability"): slow clients, a disconnect storm, worker SIGKILL, a short soak, a drain,
// bundle tampering and unwritable records, each driven over HTTP through the process
// launcher. It prints one table: scenario, load, faults, requests lost, records lost (the
// goal is 0 and 0). A request is lost when it ends with neither its answer nor an error the
// server sent (a 4xx/5xx body or a stream's error event): a hang, a cut stream, a reset. A
// record is lost when a request that reached the server (the client sent its X-Request-Id)
// has no record, or more than one.
package reliability

import (
	"strings"
	"testing"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
)

func TestReliability(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "qual-server reliability")
}

// enabled: the suite runs minutes of faults; go test ./... (make unit) skips it unless the
// label filter asks for it.
func enabled() bool {
	return strings.Contains(GinkgoLabelFilter(), "reliability")
}
