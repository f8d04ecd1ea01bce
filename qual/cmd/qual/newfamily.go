package main

import (
	"errors"
	"flag"
	"fmt"
	"github.com/modelqual/modelqual/fixtures"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"text/template"
)

func init() {
	register("new-family", "scaffold a family folder (suite, pending gate specs, reference stub, manifest template)", runNewFamily)
}

const newFamilyUsage = `Usage: qual new-family NAME [--owner OWNER] [--native-family F] [--architecture A] [--task T] [--checkpoint ORG/NAME]

Creates families/NAME with everything a family needs and, unless they exist, the native model
files native/models/F.cc and native/models/F.cu that register family F for architecture A on
the CPU and on CUDA, in a state that compiles and whose specs are pending until the owner
finishes it:

  native/models/F.cc           the runtime family: resolve (config.json -> hyper-parameters) and
                               the CPU model, registered with MQ_REGISTER_FAMILY
  native/models/F.cu           the GPU model (make cuda compiles every native/models/*.cu),
                               registered with MQB_REGISTER_FAMILY: for task text or vision the
                               shared decoder's shape and tensor names, for image the pipeline

  doc.go                       the package doc
  suite_test.go                the Ginkgo suite (RunSpecs) and, commented out, the spec.NewSuite call
  gates_test.go                one pending spec per gate, labelled NAME, owner:OWNER, premerge
  reference/reference.go       the reference forward pass stub (Load, GreedyLogits, EachLogits)
  manifest.yaml.example        the manifest to fill in and rename to manifest.yaml
  thresholds.yaml.example      the parity tolerances to fill in and rename to thresholds.yaml
  corpus.jsonl                 two example prompts; a family needs at least 12

Then: write reference/reference.go from the architecture's definition (see
families/qwen/reference), generate goldens, fill in the manifest and thresholds, replace the
pending specs with the qual/spec gates (see families/qwen/*_test.go), and write the forward
pass in native/models/F.cc (see native/models/qwen3.cc) and the GPU model in native/models/F.cu
(see native/models/qwen3.cu, qwen3vl.cu, zimage.cu). Nothing else changes: no list, no dispatch
table. NAME must be a lowercase Go identifier.

Flags:
`

var familyIdent = regexp.MustCompile(`^[a-z][a-z0-9]*$`)

func runNewFamily(args []string) int {
	fs := flag.NewFlagSet("new-family", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), newFamilyUsage)
		fs.PrintDefaults()
	}
	owner := fs.String("owner", "", "owner label value (owner:OWNER); default NAME-owners")
	native := fs.String("native-family", "", "bundle family of the native model code (default NAME)")
	checkpoint := fs.String("checkpoint", "", "hub checkpoint id ORG/NAME for the manifest template (default ORG/NAME)")
	arch := fs.String("architecture", "", "config.json architecture the native family serves (default: NAME capitalised + ForCausalLM)")
	task := fs.String("task", "text", "the family's task: text, image or vision")
	dir := fs.String("dir", "", "folder to create (default <repo>/families/NAME); for tests")
	// Flags may follow the name: qual new-family mistral --owner alice.
	var name string
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		name, args = args[0], args[1:]
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if name == "" && fs.NArg() == 1 {
		name = fs.Arg(0)
	} else if fs.NArg() > 0 || name == "" {
		fs.Usage()
		return 2
	}
	if !familyIdent.MatchString(name) || name == "internal" {
		fmt.Fprintf(os.Stderr, "qual new-family: %q must be a lowercase Go identifier such as \"mistral\" (it names the folder, the package and the label)\n", name)
		return 2
	}
	if *owner == "" {
		*owner = name + "-owners"
	}
	if *native == "" {
		*native = name
	}
	if *checkpoint == "" {
		*checkpoint = "ORG/NAME"
	}
	if *arch == "" {
		*arch = strings.ToUpper(name[:1]) + name[1:] + "ForCausalLM"
	}
	if *task != "text" && *task != "image" && *task != "vision" {
		fmt.Fprintf(os.Stderr, "qual new-family: --task %q: want text, image or vision\n", *task)
		return 2
	}
	if !familyIdent.MatchString(*native) {
		fmt.Fprintf(os.Stderr, "qual new-family: --native-family %q must be a lowercase identifier such as \"mistral\"\n", *native)
		return 2
	}
	root, err := fixtures.RepoRoot()
	if err != nil {
		fmt.Fprintf(os.Stderr, "qual new-family: %v\n", err)
		return 1
	}
	target := *dir
	if target == "" {
		target = filepath.Join(root, "families", name)
	}
	target, _ = filepath.Abs(target)
	rel, err := filepath.Rel(root, target)
	if err != nil || strings.HasPrefix(rel, "..") {
		fmt.Fprintf(os.Stderr, "qual new-family: %s is outside the repository %s; the family must live inside the module\n", target, root)
		return 2
	}
	if _, err := os.Stat(target); err == nil {
		fmt.Fprintf(os.Stderr, "qual new-family: %s already exists; pick another name or remove it\n", target)
		return 1
	}
	data := scaffoldData{Name: name, Owner: *owner, Native: *native, Checkpoint: *checkpoint, Arch: *arch, Task: *task,
		Import: "github.com/modelqual/modelqual/" + filepath.ToSlash(rel)}
	if err := writeScaffold(target, data); err != nil {
		_ = os.RemoveAll(target)
		fmt.Fprintf(os.Stderr, "qual new-family: %v\n", err)
		return 1
	}
	for _, nf := range []struct{ ext, text, what string }{
		{".cc", scaffoldNative, "the CPU model"},
		{".cu", scaffoldCUDA, "the GPU model"},
	} {
		nativeFile := filepath.Join(root, "native", "models", *native+nf.ext)
		if _, err := os.Stat(nativeFile); err == nil {
			fmt.Printf("native/models/%s%s exists: the family reuses it\n", *native, nf.ext)
		} else if err := writeTemplate(nativeFile, "native"+nf.ext, nf.text, data); err != nil {
			fmt.Fprintf(os.Stderr, "qual new-family: %v\n", err)
			return 1
		} else {
			fmt.Printf("created %s (registers family %s for %s; write %s)\n", nativeFile, *native, *arch, nf.what)
		}
	}
	fmt.Printf("created %s\nnext: go vet ./%s/... && go run github.com/onsi/ginkgo/v2/ginkgo --label-filter=%s ./%s (its specs are pending)\n",
		target, filepath.ToSlash(rel), name, filepath.ToSlash(rel))
	return 0
}

type scaffoldData struct{ Name, Owner, Native, Checkpoint, Arch, Task, Import string }

func writeScaffold(dir string, d scaffoldData) error {
	files := map[string]string{
		"doc.go":                  scaffoldDoc,
		"suite_test.go":           scaffoldSuite,
		"gates_test.go":           scaffoldGates,
		"reference/reference.go":  scaffoldReference,
		"manifest.yaml.example":   scaffoldManifest,
		"thresholds.yaml.example": scaffoldThresholds,
		"corpus.jsonl":            scaffoldCorpus,
	}
	for name, text := range files {
		if err := writeTemplate(filepath.Join(dir, name), name, text, d); err != nil {
			return err
		}
	}
	return nil
}

// writeTemplate executes text (delimiters << >>) with d into path, creating its folder.
func writeTemplate(path, name, text string, d scaffoldData) error {
	t, err := template.New(name).Delims("<<", ">>").Parse(text)
	if err != nil {
		return fmt.Errorf("template %s: %w", name, err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return err
	}
	err = t.Execute(f, d)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

const scaffoldNative = `// models/<<.Native>>.cc: the <<.Native>> family's native model (owner: <<.Owner>>), scaffolded by
// qual new-family. It registers itself below; nothing else in the runtime names it. Write
// resolve (config.json -> the hyper-parameters the model and any device backend read, with
// transformers' defaults, refusing what the model does not implement) and the CPU forward pass
// (a CausalLM's run(): see qwen3.cc for a decoder, which shares the kernels of runtime.h).
#include "runtime.h"

namespace mq {
namespace {

void resolve_<<.Native>>(const Config &c, HParams &hp) {
  hp.set("vocab_size", (double)c.positive("vocab_size"));
  hp.set("max_positions", (double)c.positive("max_position_embeddings"));
}

std::unique_ptr<Backend> make_<<.Native>>(const ModelArgs &) {
  throw Error(MQ_ERR_LOAD, "family <<.Native>>: the forward pass is not written yet (native/models/<<.Native>>.cc)");
}

}  // namespace

MQ_REGISTER_FAMILY(Family{"<<.Native>>", "<<.Task>>", {"<<.Arch>>"}, resolve_<<.Native>>, make_<<.Native>>});

}  // namespace mq
`

// scaffoldCUDA registers the family with the CUDA library. A text or vision family runs on the
// shared decoder (native/cuda/decoder.cuh): configure picks its shape, load names its tensors;
// an image family's pipeline opens through image_open. Until the owner writes them, opening the
// family on the GPU fails and says where to write.
const scaffoldCUDA = `// models/<<.Native>>.cu: the <<.Native>> family's GPU model (owner: <<.Owner>>), scaffolded by
// qual new-family. It registers itself below (MQB_REGISTER_FAMILY); nothing in the CUDA core
// names it, and make cuda compiles every native/models/*.cu.
<<- if eq .Task "image">>
// Write the pipeline (see zimage.cu): image_open uploads the weights, image_generate runs the
// text encoder, the denoising loop and the decoder with the ops of native/cuda/ops.
<<- else>>
// Write configure (the shared decoder's shape: norm, gated MLP, rotary rows; the family's own
// hyper-parameters and faults) and load (its tensor names, uploaded with weights.cuh); see
// qwen3.cu, gpt2.cu<<if eq .Task "vision">> and, for the image hooks, qwen3vl.cu<<end>>.
<<- end>>
#include "../cuda/env.cuh"
#include "../cuda/weights.cuh"

namespace mqcuda {
namespace family_<<.Native>> {
namespace {

<<if eq .Task "image" ->>
void *image_open(const mqb_model_params *) {
  throw Fail("cuda backend: family <<.Native>>: the GPU pipeline is not written yet (native/models/<<.Native>>.cu)");
}
void image_generate(void *, const mqb_image_args *) {}
void image_close(void *) {}

MQB_REGISTER_FAMILY([] {
  CudaFamily f{"<<.Native>>"};
  f.image_open = image_open;
  f.image_generate = image_generate;
  f.image_close = image_close;
  return f;
}());
<<- else ->>
void configure(Cfg &c, const HParams &) {
  c.norm = PREP_RMS;
  c.gated = true;
}

void load(mqb_model &, const TensorMap &) {
  throw Fail("cuda backend: family <<.Native>>: the GPU model is not written yet (native/models/<<.Native>>.cu)");
}

MQB_REGISTER_FAMILY([] {
  CudaFamily f{"<<.Native>>"};
  f.configure = configure;
  f.load = load;
  return f;
}());
<<- end>>

}  // namespace
}  // namespace family_<<.Native>>
}  // namespace mqcuda
`

const scaffoldDoc = `// Package <<.Name>> is the <<.Name>> family's qualification suite (scaffolded by qual
// new-family): spec files calling qual/spec, manifest.yaml, thresholds.yaml, corpus.jsonl and
// the family-owned reference forward pass in <<.Name>>/reference.
package <<.Name>>
`

const scaffoldSuite = `package <<.Name>>_test

import (
	"testing"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
)

func TestFamily(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "<<.Name>> family")
}

// When manifest.yaml, thresholds.yaml, the corpus and the reference exist, replace this
// comment with the suite (see families/qwen/suite_test.go):
//
//	var suite = spec.NewSuite(spec.SuiteInput{
//		Family: "<<.Name>>",
//		Reference: func(dir string) (spec.Reference, error) { return reference.Load(dir) },
//	})
`

const scaffoldGates = `package <<.Name>>_test

import (
	. "github.com/onsi/ginkgo/v2"

	"github.com/modelqual/modelqual/qual/spec"
)

// Pending until the family is complete. Then replace them with the family's gates, declared
// once and run on CPU (premerge), in a container and on a GPU, as families/qwen/gates_test.go
// does:
//
//	var _ = suite.Qualify(context.Background(), func(ctx context.Context) {
//		spec.BundleProvenance(ctx, suite.ProvenanceInput)
//		spec.ParityGate(ctx, suite.ParityInput)
//		...
//	})
var _ = Describe("<<.Name>> qualification", spec.Family("<<.Name>>"), spec.Owner("<<.Owner>>"), spec.Premerge(), func() {
	PIt("serves the bundle the manifest names (spec.BundleProvenance)", spec.Gate(spec.GateProvenance))
	PIt("matches the family reference on the corpus (spec.ParityGate)", spec.Gate(spec.GateParity))
	PIt("matches the transformers golden (spec.GoldenParity)", spec.Gate(spec.GateParity))
	PIt("streams deltas that concatenate to the answer (spec.StreamingParity)", spec.Gate(spec.GateParity), spec.Task(spec.TaskStream))
	PIt("honours the context contract (spec.ContextContract)", spec.Gate(spec.GateContract))
	PIt("sustains the manifest's load profiles (suite.LoadProfiles)", spec.Gate(spec.GateLoad))
})
`

const scaffoldReference = `// Package reference is the <<.Name>> family's own forward pass, in float64 on gonum, to be
// written from the architecture's definition (not from the native engine's code) so that the
// parity gate compares two independent implementations. See families/qwen/reference.
package reference

import "fmt"

// Model is a loaded <<.Name>> checkpoint.
type Model struct{ Dir string }

// Load reads config.json and model.safetensors from a checkpoint directory.
func Load(dir string) (*Model, error) {
	return nil, fmt.Errorf("<<.Name>> reference: not written yet; implement Load, GreedyLogits and EachLogits in %s", "families/<<.Name>>/reference")
}

// GreedyLogits returns the steps tokens greedy decoding chooses after ids (EOS ignored) and,
// per step, the logits row that chose each.
func (m *Model) GreedyLogits(ids []int32, steps int) ([]int32, [][]float64, error) {
	return nil, nil, fmt.Errorf("<<.Name>> reference: GreedyLogits not written yet")
}

// EachLogits calls fn with the full-vocabulary logits of every position of ids, in order.
func (m *Model) EachLogits(ids []int32, fn func(pos int, row []float64) error) error {
	return fmt.Errorf("<<.Name>> reference: EachLogits not written yet")
}
`

const scaffoldManifest = `# <<.Name>> family manifest (fill in, then rename to manifest.yaml). Owner: <<.Owner>>.
# Schema: qual/manifest. Every field is checked; unknown fields are errors.
family: <<.Name>>
native_family: <<.Native>>          # the runtime family of native/models/<<.Native>>.cc
owner: <<.Owner>>
tasks: [<<.Task>>]
checkpoint:
  id: <<.Checkpoint>>
  revision: 0000000000000000000000000000000000000000   # the 40-hex hub commit; a branch name is refused
  # fixture: <<.Name>>-tiny          # a generated tiny fixture standing in for the checkpoint (fixtures.Ensure)
build:
  precision: fp32
  max_context: 1024
  max_batch: 16
  backend: cpu
server:
  workers: 1
  startup_timeout: 60s
  request_timeout: 60s
profiles:
  - name: completions-closed
    premerge: true
    endpoint: completions
    stream: false
    concurrency: [1, 4]
    requests: 24
    warmup: 4
    input_tokens_mean: 32
    input_tokens_stddev: 0
    output_tokens: 16
`

const scaffoldThresholds = `# <<.Name>> parity tolerances (fill in, then rename to thresholds.yaml). Owner: <<.Owner>>.
max_abs_logit_diff: 1.0e-4   # fp32 engine vs float64 reference, every logit of every position
greedy_steps: 32
corpus_min_pass: 12          # at least this many corpus prompts must pass
`

const scaffoldCorpus = `{"name":"short-hello","prompt":"Hello"}
{"name":"code-python","prompt":"def add(a, b):\n    return a + b\n"}
`
