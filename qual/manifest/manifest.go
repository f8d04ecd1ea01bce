// Package manifest reads a family's manifest.yaml and thresholds.yaml: which checkpoint (and
// immutable revision) the family qualifies, how its bundle is built, how its server is run,
// which load profiles it sweeps, and the parity tolerances.
//
// Why a strict reader: a family owner's typo ("max_contxt") must fail loudly with the field's
// name rather than silently fall back to a default and qualify something else.
package manifest

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/modelqual/modelqual/native/bundle"
	"sigs.k8s.io/yaml"
)

// Duration is a time.Duration written as a Go duration string in YAML ("30s", "2m").
type Duration struct{ time.Duration }

// UnmarshalJSON accepts a duration string such as "90s".
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("duration %s is not a string like \"30s\"", b)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("duration %q: %v", s, err)
	}
	d.Duration = v
	return nil
}

// MarshalJSON writes the duration string.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(d.String()) }

// Checkpoint names the upstream checkpoint a family qualifies.
type Checkpoint struct {
	ID       string `json:"id"`       // ORG/NAME
	Revision string `json:"revision"` // 40-hex commit
	// Fixture is the generated tiny fixture (gpt2-tiny, qwen3-tiny) standing in for the
	// checkpoint, or "" when a real hub cache is used.
	Fixture string `json:"fixture,omitempty"`
}

// Build holds the bundle build settings the served bundle must have been built with.
type Build struct {
	Precision  string `json:"precision"`   // fp32 | bf16 | fp16
	MaxContext int    `json:"max_context"` // 0: the builder's default
	MaxBatch   int    `json:"max_batch"`   // 0: the builder's default
	Backend    string `json:"backend"`     // cpu | cuda
}

// Server holds how the serving stack is run for this family.
type Server struct {
	Workers        int      `json:"workers"`
	StartupTimeout Duration `json:"startup_timeout"`
	RequestTimeout Duration `json:"request_timeout"`
}

// Profile is one load profile: closed loop (Concurrency sweep) or open loop (RequestRate sweep).
type Profile struct {
	Name     string `json:"name"`
	Premerge bool   `json:"premerge"`
	Endpoint string `json:"endpoint"` // completions | chat | images
	// InputFile (endpoint images) is the JSONL of requests with their controls (prompt, size,
	// num_inference_steps, guidance_scale, seed), relative to the manifest's folder; the
	// profile sends its lines in order, round robin. Token lengths do not apply to images.
	InputFile         string    `json:"input_file,omitempty"`
	Stream            bool      `json:"stream"`
	Concurrency       []int     `json:"concurrency,omitempty"`
	RequestRate       []float64 `json:"request_rate,omitempty"`    // requests/s
	MaxConcurrency    int       `json:"max_concurrency,omitempty"` // open loop cap; 0 = none
	Requests          int       `json:"requests,omitempty"`        // per sweep point
	Duration          Duration  `json:"duration,omitempty"`        // per sweep point
	Warmup            int       `json:"warmup"`                    // warmup requests, reported apart
	InputTokensMean   int       `json:"input_tokens_mean"`
	InputTokensStddev int       `json:"input_tokens_stddev"`
	OutputTokens      int       `json:"output_tokens"`
	// OutputTokensStddev > 0 gives each prompt its own output length, drawn around
	// OutputTokens, so the requests of a closed loop do not finish and arrive in waves.
	OutputTokensStddev int               `json:"output_tokens_stddev,omitempty"`
	SLO                map[string]string `json:"slo,omitempty"` // metric -> limit, e.g. ttft_p99: 500ms
	// Images (endpoint chat, a vision task) puts images into the profile's requests, as
	// `qual profile --image-*` does: synthetic ones of about width_mean x height_mean, or the
	// files of dir (relative to the manifest's folder).
	Images *ProfileImages `json:"images,omitempty"`
}

// ProfileImages is a chat profile's images (load.ImageOptions; AIPerf's image flags).
type ProfileImages struct {
	Dir          string  `json:"dir,omitempty"`
	WidthMean    int     `json:"width_mean,omitempty"`
	HeightMean   int     `json:"height_mean,omitempty"`
	WidthStddev  int     `json:"width_stddev,omitempty"`
	HeightStddev int     `json:"height_stddev,omitempty"`
	Format       string  `json:"format,omitempty"`      // png (default) | jpeg
	Fraction     float64 `json:"fraction,omitempty"`    // of the requests that carry images; 0: all
	PerRequest   int     `json:"per_request,omitempty"` // images in each such request; 0: 1
}

// Manifest is a family's manifest.yaml.
type Manifest struct {
	Family       string     `json:"family"`        // label name: gpt2, qwen
	NativeFamily string     `json:"native_family"` // runtime family (native/models/<family>.cc), e.g. qwen3
	Owner        string     `json:"owner"`
	Tasks        []string   `json:"tasks"` // text, chat
	Checkpoint   Checkpoint `json:"checkpoint"`
	Build        Build      `json:"build"`
	Server       Server     `json:"server"`
	Profiles     []Profile  `json:"profiles"`

	path string
}

// Load reads and validates a manifest. Unknown fields are errors.
func Load(path string) (*Manifest, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("manifest: %w", err)
	}
	m := &Manifest{}
	if err := yaml.UnmarshalStrict(b, m); err != nil {
		return nil, fmt.Errorf("manifest %s: %s", path, yamlError(err))
	}
	m.path = path
	if err := m.Validate(); err != nil {
		return nil, err
	}
	return m, nil
}

// Path is the file the manifest was loaded from ("" when built in code).
func (m *Manifest) Path() string { return m.path }

var (
	familyName = regexp.MustCompile(`^[a-z][a-z0-9-]*$`)
	// nativeFamilyName is a runtime family name (a bundle header's family).
	nativeFamilyName = regexp.MustCompile(`^[a-z][a-z0-9_]*$`)
	hex40            = regexp.MustCompile(`^[0-9a-f]{40}$`)
	checkpoint       = regexp.MustCompile(`^[^/\s]+/[^/\s]+$`)
)

// Tasks a manifest may declare (a subset of qual/spec's task labels).
var knownTasks = []string{"text", "chat", "image", "vision"}

func (m *Manifest) errf(field, format string, args ...any) error {
	where := m.path
	if where == "" {
		where = "(in memory)"
	}
	return fmt.Errorf("manifest %s: %s %s", where, field, fmt.Sprintf(format, args...))
}

// Validate checks every field and names the first invalid one.
func (m *Manifest) Validate() error {
	if !familyName.MatchString(m.Family) {
		return m.errf("family", "%q must be a lowercase name like \"qwen\"", m.Family)
	}
	// Whether the runtime has this family is the bundle's and the runtime's check (qual
	// bundle build, the server's start); here only its form.
	if !nativeFamilyName.MatchString(m.NativeFamily) {
		return m.errf("native_family", "%q must name a runtime family (native/models/<family>.cc), e.g. \"qwen3\"", m.NativeFamily)
	}
	if strings.TrimSpace(m.Owner) == "" {
		return m.errf("owner", "is empty; name the family's owner")
	}
	if len(m.Tasks) == 0 {
		return m.errf("tasks", "is empty; list at least \"text\"")
	}
	for i, t := range m.Tasks {
		if !slices.Contains(knownTasks, t) {
			return m.errf(fmt.Sprintf("tasks[%d]", i), "%q is not one of %s", t, strings.Join(knownTasks, ", "))
		}
	}
	if !checkpoint.MatchString(m.Checkpoint.ID) {
		return m.errf("checkpoint.id", "%q is not of the form ORG/NAME", m.Checkpoint.ID)
	}
	if !hex40.MatchString(m.Checkpoint.Revision) {
		return m.errf("checkpoint.revision", "%q is not immutable; pin a 40-hex commit", m.Checkpoint.Revision)
	}
	if m.Checkpoint.Fixture != "" && !familyName.MatchString(strings.ReplaceAll(m.Checkpoint.Fixture, ".", "-")) {
		return m.errf("checkpoint.fixture", "%q is not a fixture name like \"qwen3-tiny\"", m.Checkpoint.Fixture)
	}
	if err := m.validateBuild(); err != nil {
		return err
	}
	if m.Server.Workers < 1 {
		return m.errf("server.workers", "%d must be at least 1", m.Server.Workers)
	}
	if m.Server.StartupTimeout.Duration <= 0 {
		return m.errf("server.startup_timeout", "%v must be positive (e.g. \"120s\")", m.Server.StartupTimeout.Duration)
	}
	if m.Server.RequestTimeout.Duration <= 0 {
		return m.errf("server.request_timeout", "%v must be positive (e.g. \"60s\")", m.Server.RequestTimeout.Duration)
	}
	names := map[string]bool{}
	for i := range m.Profiles {
		if err := m.validateProfile(i, names); err != nil {
			return err
		}
	}
	return nil
}

func (m *Manifest) validateBuild() error {
	b := m.Build
	switch b.Precision {
	case "fp32", "bf16", "fp16":
	default:
		return m.errf("build.precision", "%q is not one of fp32, bf16, fp16", b.Precision)
	}
	switch b.Backend {
	case "cpu":
		if b.Precision != "fp32" {
			return m.errf("build.precision", "%q needs backend cuda (the CPU runtime is fp32)", b.Precision)
		}
	case "cuda":
	default:
		return m.errf("build.backend", "%q is not one of cpu, cuda", b.Backend)
	}
	if b.MaxContext < 0 {
		return m.errf("build.max_context", "%d is negative", b.MaxContext)
	}
	if b.MaxBatch < 0 {
		return m.errf("build.max_batch", "%d is negative", b.MaxBatch)
	}
	return nil
}

func (m *Manifest) validateProfile(i int, names map[string]bool) error {
	p := m.Profiles[i]
	f := func(field string) string { return fmt.Sprintf("profiles[%d].%s", i, field) }
	if !familyName.MatchString(p.Name) {
		return m.errf(f("name"), "%q must be a lowercase name like \"chat-sweep\"", p.Name)
	}
	if names[p.Name] {
		return m.errf(f("name"), "%q is used by two profiles", p.Name)
	}
	names[p.Name] = true
	switch p.Endpoint {
	case "completions":
	case "chat":
		if !slices.Contains(m.Tasks, "chat") && !slices.Contains(m.Tasks, "vision") {
			return m.errf(f("endpoint"), "is chat but tasks %v lack \"chat\"", m.Tasks)
		}
	case "images":
		if !slices.Contains(m.Tasks, "image") {
			return m.errf(f("endpoint"), "is images but tasks %v lack \"image\"", m.Tasks)
		}
	default:
		return m.errf(f("endpoint"), "%q is not one of completions, chat, images", p.Endpoint)
	}
	if p.Endpoint == "images" {
		if p.InputFile == "" {
			return m.errf(f("input_file"), "is required for endpoint images: a JSONL of requests with prompt, size, num_inference_steps, guidance_scale and seed, relative to the manifest")
		}
		if st, err := os.Stat(m.InputPath(p)); err != nil || !st.Mode().IsRegular() {
			return m.errf(f("input_file"), "%q is not a file next to the manifest (%s)", p.InputFile, m.InputPath(p))
		}
		if p.Stream || p.InputTokensMean != 0 || p.InputTokensStddev != 0 || p.OutputTokens != 0 || p.OutputTokensStddev != 0 {
			return m.errf(f("endpoint"), "images takes neither stream nor token lengths (input_tokens_*, output_tokens*); its requests come from input_file")
		}
	} else if p.InputFile != "" {
		return m.errf(f("input_file"), "applies to endpoint images only; text profiles draw synthetic prompts of input_tokens_mean")
	}
	if err := m.validateImages(f, p); err != nil {
		return err
	}
	if (len(p.Concurrency) == 0) == (len(p.RequestRate) == 0) {
		return m.errf(f("concurrency"), "and request_rate: set exactly one (closed loop or open loop)")
	}
	for j, c := range p.Concurrency {
		if c < 1 {
			return m.errf(f(fmt.Sprintf("concurrency[%d]", j)), "%d must be at least 1", c)
		}
	}
	for j, r := range p.RequestRate {
		if !(r > 0) {
			return m.errf(f(fmt.Sprintf("request_rate[%d]", j)), "%v must be positive", r)
		}
	}
	if p.MaxConcurrency < 0 {
		return m.errf(f("max_concurrency"), "%d is negative", p.MaxConcurrency)
	}
	if p.Requests < 0 || p.Duration.Duration < 0 {
		return m.errf(f("requests"), "%d and duration %v must not be negative", p.Requests, p.Duration.Duration)
	}
	if p.Requests == 0 && p.Duration.Duration == 0 {
		return m.errf(f("requests"), "and duration are both unset; set one to bound each sweep point")
	}
	if p.Warmup < 0 {
		return m.errf(f("warmup"), "%d is negative", p.Warmup)
	}
	if p.Endpoint == "images" {
		return m.validateSLOs(f, p)
	}
	if p.InputTokensMean < 1 {
		return m.errf(f("input_tokens_mean"), "%d must be at least 1", p.InputTokensMean)
	}
	if p.InputTokensStddev < 0 {
		return m.errf(f("input_tokens_stddev"), "%d is negative", p.InputTokensStddev)
	}
	if p.OutputTokens < 1 {
		return m.errf(f("output_tokens"), "%d must be at least 1", p.OutputTokens)
	}
	if p.OutputTokensStddev < 0 {
		return m.errf(f("output_tokens_stddev"), "%d is negative", p.OutputTokensStddev)
	}
	return m.validateSLOs(f, p)
}

// validateImages checks a profile's images block: chat profiles of a vision family only, a
// folder next to the manifest or a synthetic size, and counts in range.
func (m *Manifest) validateImages(f func(string) string, p Profile) error {
	im := p.Images
	if im == nil {
		return nil
	}
	switch {
	case p.Endpoint != "chat" || !slices.Contains(m.Tasks, "vision"):
		return m.errf(f("images"), "applies to endpoint chat of a family whose tasks include \"vision\" (endpoint %q, tasks %v)", p.Endpoint, m.Tasks)
	case (im.Dir != "") == (im.WidthMean > 0 || im.HeightMean > 0):
		return m.errf(f("images"), "set either dir or width_mean and height_mean (synthetic images)")
	case im.Dir == "" && (im.WidthMean < 1 || im.HeightMean < 1):
		return m.errf(f("images.width_mean"), "%d and height_mean %d must both be at least 1", im.WidthMean, im.HeightMean)
	case im.WidthStddev < 0 || im.HeightStddev < 0:
		return m.errf(f("images.width_stddev"), "%d and height_stddev %d must not be negative", im.WidthStddev, im.HeightStddev)
	case im.Format != "" && im.Format != "png" && im.Format != "jpeg":
		return m.errf(f("images.format"), "%q is not png or jpeg", im.Format)
	case im.Fraction < 0 || im.Fraction > 1:
		return m.errf(f("images.fraction"), "%v must be in (0, 1] (0: every request)", im.Fraction)
	case im.PerRequest < 0:
		return m.errf(f("images.per_request"), "%d must be at least 1 (0: 1)", im.PerRequest)
	}
	if im.Dir != "" {
		if st, err := os.Stat(m.ImageDir(p)); err != nil || !st.IsDir() {
			return m.errf(f("images.dir"), "%q is not a folder next to the manifest (%s)", im.Dir, m.ImageDir(p))
		}
	}
	return nil
}

// ImageDir is a profile's images.dir resolved against the manifest's folder ("" without one).
func (m *Manifest) ImageDir(p Profile) string {
	if p.Images == nil || p.Images.Dir == "" {
		return ""
	}
	if filepath.IsAbs(p.Images.Dir) {
		return p.Images.Dir
	}
	return filepath.Join(filepath.Dir(m.path), p.Images.Dir)
}

func (m *Manifest) validateSLOs(f func(string) string, p Profile) error {
	for k, v := range p.SLO {
		if k == "" {
			return m.errf(f("slo"), "has an empty metric name")
		}
		if _, err := time.ParseDuration(v); err != nil {
			if _, err := strconv.ParseFloat(v, 64); err != nil {
				return m.errf(f("slo."+k), "%q is neither a duration (\"500ms\") nor a number", v)
			}
		}
	}
	return nil
}

// Expect is what a served bundle must match (bundle.Header.Check).
func (m *Manifest) Expect() bundle.Expect {
	return bundle.Expect{
		Family:       m.NativeFamily,
		CheckpointID: m.Checkpoint.ID,
		Revision:     m.Checkpoint.Revision,
		Precision:    m.Build.Precision,
		Backend:      m.Build.Backend,
		MaxContext:   m.Build.MaxContext,
	}
}

// InputPath is p's input_file resolved against the manifest's folder.
func (m *Manifest) InputPath(p Profile) string {
	if p.InputFile == "" || filepath.IsAbs(p.InputFile) {
		return p.InputFile
	}
	return filepath.Join(filepath.Dir(m.path), p.InputFile)
}

// Profile finds a profile by name.
func (m *Manifest) Profile(name string) (Profile, bool) {
	for _, p := range m.Profiles {
		if p.Name == name {
			return p, true
		}
	}
	return Profile{}, false
}

// Thresholds are a family's parity tolerances (thresholds.yaml). GPU, when present, holds the
// looser tolerances of reduced-precision (bf16) GPU runs.
//
// A text family sets the logits fields; a text-to-image family (task image) sets the image
// fields instead, and may leave the logits fields out: its reference is an image pipeline's
// pixels and latents, not a logits forward pass.
type Thresholds struct {
	MaxAbsLogitDiff float64 `json:"max_abs_logit_diff,omitempty"`
	GreedySteps     int     `json:"greedy_steps,omitempty"`
	CorpusMinPass   int     `json:"corpus_min_pass"`
	// GreedyTieMargin, when > 0 (a gpu: block), accepts a greedy divergence from the
	// reference at a step where the reference's own top-two logits are within this margin:
	// a near-tie that reduced-precision rounding may break either way (vLLM's bf16 tests
	// accept such a divergence the same way). The comparison of that sequence ends there.
	GreedyTieMargin float64 `json:"greedy_tie_margin,omitempty"`
	// PSNRMinDB and SSIMMin bound every served image against the reference pipeline's pixels.
	PSNRMinDB float64 `json:"psnr_min_db,omitempty"`
	SSIMMin   float64 `json:"ssim_min,omitempty"`
	// MaxAbsLatentDiff bounds the served final latents against the reference's where the
	// server exposes them (0: reported, not gated).
	MaxAbsLatentDiff float64 `json:"max_abs_latent_diff,omitempty"`
	// Precision (a gpu: block only) is the precision the family's gpu specs build their cuda
	// bundle at when MODELQUAL_GPU_PRECISION is unset (default bf16): fp32 where a fixture's
	// reference cannot be met in bf16 by any engine, as a random-weight router whose top-k
	// choices are near-ties that bf16 rounding flips (transformers' own bf16 run then differs).
	Precision string      `json:"precision,omitempty"`
	GPU       *Thresholds `json:"gpu,omitempty"`
}

// Image reports whether t holds image bounds (a text-to-image family's thresholds).
func (t *Thresholds) Image() bool {
	return t.PSNRMinDB != 0 || t.SSIMMin != 0 || t.MaxAbsLatentDiff != 0
}

// LoadThresholds reads and validates thresholds.yaml. Unknown fields are errors.
func LoadThresholds(path string) (*Thresholds, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("thresholds: %w", err)
	}
	t := &Thresholds{}
	if err := yaml.UnmarshalStrict(b, t); err != nil {
		return nil, fmt.Errorf("thresholds %s: %s", path, yamlError(err))
	}
	if err := t.validate(path, ""); err != nil {
		return nil, err
	}
	return t, nil
}

// Validate checks the tolerances and names the first invalid field.
func (t *Thresholds) Validate() error { return t.validate("(in memory)", "") }

func (t *Thresholds) validate(path, prefix string) error {
	if t.Image() {
		if !(t.PSNRMinDB > 0) || math.IsInf(t.PSNRMinDB, 0) {
			return fmt.Errorf("thresholds %s: %spsnr_min_db %v must be a positive number of dB (an image family sets psnr_min_db and ssim_min)", path, prefix, t.PSNRMinDB)
		}
		if !(t.SSIMMin > 0 && t.SSIMMin <= 1) {
			return fmt.Errorf("thresholds %s: %sssim_min %v must be in (0, 1]", path, prefix, t.SSIMMin)
		}
		if !(t.MaxAbsLatentDiff >= 0) || math.IsInf(t.MaxAbsLatentDiff, 0) {
			return fmt.Errorf("thresholds %s: %smax_abs_latent_diff %v must be a finite number >= 0 (0: reported, not gated)", path, prefix, t.MaxAbsLatentDiff)
		}
	}
	if !t.Image() || t.MaxAbsLogitDiff != 0 || t.GreedySteps != 0 {
		if !(t.MaxAbsLogitDiff > 0) {
			return fmt.Errorf("thresholds %s: %smax_abs_logit_diff %v must be positive (an image family sets psnr_min_db and ssim_min instead)", path, prefix, t.MaxAbsLogitDiff)
		}
		if t.GreedySteps < 1 {
			return fmt.Errorf("thresholds %s: %sgreedy_steps %d must be at least 1", path, prefix, t.GreedySteps)
		}
	}
	if !(t.GreedyTieMargin >= 0) || math.IsInf(t.GreedyTieMargin, 0) {
		return fmt.Errorf("thresholds %s: %sgreedy_tie_margin %v must be a finite number >= 0 (0: greedy tokens must match exactly)", path, prefix, t.GreedyTieMargin)
	}
	if t.CorpusMinPass < 0 {
		return fmt.Errorf("thresholds %s: %scorpus_min_pass %d is negative", path, prefix, t.CorpusMinPass)
	}
	switch {
	case t.Precision != "" && prefix == "":
		return fmt.Errorf("thresholds %s: precision belongs in the gpu: block (the precision of the GPU run's cuda bundle)", path)
	case t.Precision != "" && t.Precision != "bf16" && t.Precision != "fp16" && t.Precision != "fp32":
		return fmt.Errorf("thresholds %s: %sprecision %q: use bf16, fp16 or fp32", path, prefix, t.Precision)
	}
	if t.GPU != nil {
		if prefix != "" {
			return fmt.Errorf("thresholds %s: %sgpu must not nest", path, prefix)
		}
		return t.GPU.validate(path, "gpu.")
	}
	return nil
}

// yamlError drops the JSON-conversion layers sigs.k8s.io/yaml puts in front of the message
// ("error unmarshaling JSON: while decoding JSON: json: unknown field ...").
func yamlError(err error) string {
	msg := err.Error()
	for _, p := range []string{"error unmarshaling JSON: ", "while decoding JSON: ", "json: "} {
		msg = strings.TrimPrefix(msg, p)
	}
	return msg
}
