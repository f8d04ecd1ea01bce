// Package spec is the Ginkgo DSL family specs are written in: a checked label vocabulary,
// once-per-suite setup (binaries, fixtures, bundles, one server), and reusable gates in the
// Cluster API style, Gate(ctx, func() GateInput), so that a family's spec file is a few lines.
//
// Every gate's core is also a plain function returning an error (CheckParity,
// CheckStreaming, ...), which the Ginkgo spec asserts on and which the planted-defect tests
// call directly to prove that each gate can fail.
package spec

import (
	"fmt"
	"github.com/modelqual/modelqual/fixtures"
	"regexp"
	"sort"
	"strings"
	"sync"

	"github.com/onsi/ginkgo/v2"

	"github.com/modelqual/modelqual/qual/manifest"
)

// The label vocabulary of DESIGN.md. Each label has one meaning; a spec that carries a label
// outside this list is a typo that would silently drop it from a label filter, so the helpers
// below refuse it while the spec tree is built.
const (
	// Tasks: what kind of request a spec sends. Owner: the harness.
	TaskText   = "text"   // /v1/completions
	TaskChat   = "chat"   // /v1/chat/completions with the checkpoint's chat template
	TaskStream = "stream" // Server-Sent Events
	TaskImage  = "image"  // /v1/images/generations (later)
	TaskVision = "vision" // chat with one image (later)
	TaskGRPC   = "grpc"   // OpenEngine v1 gRPC (qual-server --grpc-port)

	// Gates: which promise a spec checks. Owner: the harness.
	GateProvenance = "provenance" // the served bundle is the one the manifest names
	GateParity     = "parity"     // served outputs equal the family reference
	GateContract   = "contract"   // HTTP contract: limits and refused controls
	GateLoad       = "load"       // load profiles with joined records

	// Placement: where and when a spec runs. Owner: CI.
	PlacementPremerge  = "premerge"  // CPU, tiny fixtures, every pull request (≤ 3 minutes)
	PlacementGPU       = "gpu"       // needs a GPU runner
	PlacementContainer = "container" // against the server image on a Docker engine
	PlacementSlow      = "slow"      // too slow for premerge
)

var (
	tasks     = []string{TaskText, TaskChat, TaskStream, TaskImage, TaskVision, TaskGRPC}
	gates     = []string{GateProvenance, GateParity, GateContract, GateLoad}
	placement = []string{PlacementPremerge, PlacementGPU, PlacementContainer, PlacementSlow}
)

// labelName is what a family or owner name may look like: lowercase, digits, '-', '_', '.'.
var labelName = regexp.MustCompile(`^[a-z][a-z0-9._-]*$`)

// Family labels a spec with its family. The name must be a family folder of this repository
// (families/NAME holding a manifest.yaml or spec files), or one registered with
// RegisterFamily, so that a typo such as "qwne" panics while the tree is built instead of
// silently matching nothing.
func Family(name string) ginkgo.Labels {
	if err := CheckFamily(name); err != nil {
		panic(err.Error())
	}
	return ginkgo.Label(name)
}

// Task labels a spec with the request kind it sends: text, chat, stream, image or vision.
func Task(name string) ginkgo.Labels { return ginkgo.Label(checked("spec.Task", name, tasks)) }

// Gate labels a spec with the promise it checks: provenance, parity, contract or load. The
// reusable gates of this package add their own gate label; families rarely need this.
func Gate(name string) ginkgo.Labels { return ginkgo.Label(checked("spec.Gate", name, gates)) }

// Premerge marks a spec as part of the pull-request gate: CPU only, tiny fixtures, and the
// premerge specs of all families together within 3 minutes on a 2-core runner.
func Premerge() ginkgo.Labels { return ginkgo.Label(PlacementPremerge) }

// GPU marks a spec that needs a GPU runner.
func GPU() ginkgo.Labels { return ginkgo.Label(PlacementGPU) }

// Container marks a spec that runs against the server image on a Docker engine.
func Container() ginkgo.Labels { return ginkgo.Label(PlacementContainer) }

// Slow marks a spec too slow for premerge.
func Slow() ginkgo.Labels { return ginkgo.Label(PlacementSlow) }

// Owner labels a spec with the person or team answering for it ("owner:NAME"), which
// Ginkgo's JUnit report carries, so a failing gate names who to ask.
func Owner(name string) ginkgo.Labels {
	if !labelName.MatchString(name) {
		panic(fmt.Sprintf("spec.Owner(%q): owner must match %s (lowercase, digits, '.', '_', '-')", name, labelName))
	}
	return ginkgo.Label("owner:" + name)
}

func checked(fn, name string, known []string) string {
	for _, k := range known {
		if k == name {
			return name
		}
	}
	panic(fmt.Sprintf("%s(%q): unknown label; known: %s. Add new labels to qual/spec/labels.go with an owner comment", fn, name, strings.Join(known, ", ")))
}

var (
	registeredMu sync.Mutex
	registered   = map[string]bool{}
)

// RegisterFamily adds a family name to the vocabulary for a family that lives outside this
// repository's families/ folder (a downstream repository reusing these specs).
func RegisterFamily(name string) {
	if !labelName.MatchString(name) {
		panic(fmt.Sprintf("spec.RegisterFamily(%q): family names must match %s", name, labelName))
	}
	registeredMu.Lock()
	defer registeredMu.Unlock()
	registered[name] = true
}

// CheckFamily returns an error unless name is a known family (see Family).
func CheckFamily(name string) error {
	if !labelName.MatchString(name) {
		return fmt.Errorf("spec.Family(%q): family names must match %s", name, labelName)
	}
	for _, other := range append(append(append([]string{}, tasks...), gates...), placement...) {
		if name == other {
			return fmt.Errorf("spec.Family(%q): %q is a task, gate or placement label, not a family", name, name)
		}
	}
	known := KnownFamilies()
	for _, k := range known {
		if k == name {
			return nil
		}
	}
	return fmt.Errorf("spec.Family(%q): unknown family; known: %s. A family is a folder families/NAME (scaffold one with `qual new-family NAME`)",
		name, strings.Join(known, ", "))
}

// KnownFamilies lists the registered families and the folders under the repository's
// families/ that hold a manifest.yaml or spec files (internal/ and folders starting with '_'
// excluded), sorted. A freshly scaffolded family (qual new-family) is known before its owner
// writes the manifest.
func KnownFamilies() []string {
	set := map[string]bool{}
	registeredMu.Lock()
	for n := range registered {
		set[n] = true
	}
	registeredMu.Unlock()
	if root, err := fixtures.RepoRoot(); err == nil {
		folders, _ := manifest.Discover(root)
		for _, f := range folders {
			set[f.Name] = true
		}
	}
	out := make([]string, 0, len(set))
	for n := range set {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}
