// Package envconfig is the one place where modelqual's binaries and test suites read the
// environment, as Ollama's envconfig is: every variable is declared here with its default and a
// one-line description, so a reader (and `qual env`-style help) finds every knob in one list, and
// no other package calls os.Getenv for a knob of ours.
//
// It is a leaf library: it imports nothing from the module, so the server, the harness, the
// fixtures and the families may all use it without breaking the import direction of DESIGN.md.
// The C++ runtime reads its own few variables (MODELQUAL_FAULTS, MODELQUAL_CUDA_LIB) in one
// place on its side; they are listed here too so that this list is complete.
package envconfig

import (
	"os"
	"sort"
	"strings"
)

// Var is one environment variable the project reads.
type Var struct {
	Name        string // the variable's name, e.g. MODELQUAL_CACHE
	Default     string // what applies when it is unset or empty ("" = nothing)
	Description string // one line: what it sets and who reads it
}

// The variables, by name. Keep each one's description true when its reader changes.
var (
	Cache = declare("MODELQUAL_CACHE", "", "folder of generated fixtures and built bundles (content-keyed, safe to share); unset: <checkout>/.cache/modelqual inside a checkout, else the user cache directory's modelqual/")
	Bin   = declare("MODELQUAL_BIN", "", "folder holding the qual and qual-server binaries a launcher starts; default next to the running executable, then PATH")

	Faults = declare("MODELQUAL_FAULTS", "", "comma-separated planted faults (qual/mutants) for the server, its workers and the native runtime; empty in production")

	Launcher       = declare("MODELQUAL_LAUNCHER", "", "how family suites start the server: process, container or external; unset: external when a URL is given, container when the label filter selects only container specs, else process")
	ExternalURL    = declare("MODELQUAL_EXTERNAL_URL", "", "base URL of an already running OpenAI-compatible server to qualify (implies the external launcher)")
	ExternalModel  = declare("MODELQUAL_EXTERNAL_MODEL", "", "model name to send to the external server; default the family's served model name")
	APIKey         = declare("MODELQUAL_API_KEY", "", "bearer token the suites send to an external server")
	Artifacts      = declare("MODELQUAL_ARTIFACTS", "", "folder where family suites write run reports, server logs and records; unset: <checkout>/artifacts/specs")
	HubCache       = declare("MODELQUAL_HUB_CACHE", "", "Hugging Face hub cache to find checkpoints in; default HF_HUB_CACHE, then the fixtures' cache")
	HFHubCache     = declare("HF_HUB_CACHE", "", "Hugging Face's own hub cache variable, read when MODELQUAL_HUB_CACHE is unset")
	NoSourceFinger = declare("MODELQUAL_NO_SOURCE_FINGERPRINT", "", "set to 1 to skip fingerprinting the source tree before and after a run (a runner without the checkout)")

	GPU          = declare("MODELQUAL_GPU", "", "1 (true, yes) runs a suite's GPU qualification whatever the label filter, 0 (false, no) never; unset: the label filter decides (gpu)")
	GPUs         = declare("MODELQUAL_GPUS", "", "GPUs this process may use (indexes, GPU:MIG pairs or GPU/MIG UUIDs, comma-separated); default all")
	GPUShortage  = declare("MODELQUAL_GPU_SHORTAGE", "skip", "what a GPU run does where a Ginkgo process (or a qual qualify --parallel slot) holds fewer GPUs than its server or a spec needs: skip (the specs skip, saying why) or fail; never share a GPU")
	GPUPrecision = declare("MODELQUAL_GPU_PRECISION", "bf16", "precision of the cuda bundles GPU specs build: bf16, fp16 or fp32 (unset: the family thresholds.yaml gpu.precision, else bf16)")
	CUDALib      = declare("MODELQUAL_CUDA_LIB", "", "path of libmodelqual_cuda.so for --device cuda (read by the native runtime); default next to the executable, then the loader's path")

	ServerAPIKey = declare("QUAL_SERVER_API_KEY", "", "qual-server's API key when neither --api-key nor --api-key-file is given; unset once read so workers never carry it")
	OpenAIAPIKey = declare("OPENAI_API_KEY", "", "default of qual profile's --api-key, as OpenAI's clients read it")

	GOGC       = declare("GOGC", "", "Go's collector target; qual-server sets 400 when it is unset")
	GOMAXPROCS = declare("GOMAXPROCS", "", "Go's processor count; qual-server sizes it from its CPU set when it is unset")

	TestcontainersRyukDisabled = declare("TESTCONTAINERS_RYUK_DISABLED", "", "testcontainers-go's reaper switch; the container launcher sets it when unset (no registry to pull the reaper from)")
	TestcontainersHostOverride = declare("TESTCONTAINERS_HOST_OVERRIDE", "", "testcontainers-go's host for published ports; the container launcher respects it when set")
	DockerHost                 = declare("DOCKER_HOST", "", "Docker engine address for the container launcher; default the local unix socket")
)

var all = map[string]Var{}

func declare(name, def, desc string) Var {
	v := Var{Name: name, Default: def, Description: desc}
	all[name] = v
	return v
}

// Get returns the variable's value, or its default when it is unset or empty.
func (v Var) Get() string {
	if s := os.Getenv(v.Name); s != "" {
		return s
	}
	return v.Default
}

// Lookup returns the raw value and whether the variable is set at all (even to ""), for the
// few readers that must tell "unset" from "set empty".
func (v Var) Lookup() (string, bool) { return os.LookupEnv(v.Name) }

// IsSet reports whether the variable is set to a non-empty value.
func (v Var) IsSet() bool { return os.Getenv(v.Name) != "" }

// Bool reports whether the variable is set to a true value (1, true, yes, on; any case).
func (v Var) Bool() bool {
	switch strings.ToLower(strings.TrimSpace(os.Getenv(v.Name))) {
	case "1", "true", "yes", "on":
		return true
	}
	return false
}

// All returns every variable, sorted by name, for help texts and docs.
func All() []Var {
	out := make([]Var, 0, len(all))
	for _, v := range all {
		out = append(out, v)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}
