package spec

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/onsi/ginkgo/v2"
	"github.com/onsi/ginkgo/v2/types"
	"github.com/onsi/gomega"

	"github.com/modelqual/modelqual/fixtures"
	"github.com/modelqual/modelqual/native/bundle"
	"github.com/modelqual/modelqual/qual/gpu"
	"github.com/modelqual/modelqual/qual/launch"
	"github.com/modelqual/modelqual/qual/manifest"
	"github.com/modelqual/modelqual/server/envconfig"
	"github.com/modelqual/modelqual/server/tokenizer"
)

// The environment variables that steer a suite (flags cannot reach a suite run by `ginkgo -r`)
// are declared, with their defaults and descriptions, in server/envconfig: MODELQUAL_LAUNCHER,
// MODELQUAL_EXTERNAL_URL, MODELQUAL_EXTERNAL_MODEL, MODELQUAL_API_KEY, MODELQUAL_ARTIFACTS,
// MODELQUAL_HUB_CACHE, MODELQUAL_NO_SOURCE_FINGERPRINT, MODELQUAL_BIN, MODELQUAL_FAULTS and the
// GPU ones of gpu.go.

// Test-binary flags, for runs that prefer flags to the environment:
// ginkgo ./families/qwen -- -modelqual.launcher=external -modelqual.url=http://host:8000.
// A flag wins over its environment variable.
var (
	launcherFlag = flag.String("modelqual.launcher", "", "launcher of the suite's server: process, container or external (env "+envconfig.Launcher.Name+")")
	urlFlag      = flag.String("modelqual.url", "", "server to qualify with the external launcher (env "+envconfig.ExternalURL.Name+")")
)

// SuiteInput configures a family suite.
type SuiteInput struct {
	// Family is the family's label name (its folder name); it must be a known family.
	Family string
	// Dir is the family folder holding manifest.yaml, thresholds.yaml and corpus.jsonl;
	// default "." (go test runs a package in its folder).
	Dir string
	// Reference loads the family's reference forward pass from a checkpoint directory.
	Reference func(checkpointDir string) (Reference, error)
}

// State is what the first Ginkgo process sets up and shares with the others (ginkgo -p):
// the checkpoint, the bundle and where the one server of the suite listens.
type State struct {
	Launcher     string   `json:"launcher"`
	BaseURL      string   `json:"base_url"`
	Model        string   `json:"model"`
	APIKey       string   `json:"api_key,omitempty"`
	RecordsPath  string   `json:"records_path,omitempty"`
	LogPaths     []string `json:"log_paths,omitempty"`
	PID          int      `json:"pid,omitempty"`
	Args         []string `json:"args,omitempty"`
	Env          []string `json:"env,omitempty"`
	Checkpoint   string   `json:"checkpoint"`
	Revision     string   `json:"revision"`
	Bundle       string   `json:"bundle,omitempty"`
	BundleDigest string   `json:"bundle_digest,omitempty"`
	Artifacts    string   `json:"artifacts"`
	RepoRoot     string   `json:"repo_root"`
	// Device is "cuda" for a GPU run (see gpu.go), where each process starts its own server
	// on its own GPUs, and Precision the GPU bundle's precision; "" for a CPU run.
	Device    string `json:"device,omitempty"`
	Precision string `json:"precision,omitempty"`
	// GPUSkip says why a GPU run found no GPU; nothing was built or started and every gpu
	// spec skips with this reason.
	GPUSkip string `json:"gpu_skip,omitempty"`
}

// Suite is a family suite: its manifest, thresholds and corpus (read while the spec tree is
// built), and, once the suite's setup ran, its server, API client and tokenizer.
type Suite struct {
	Family     string
	Dir        string
	Manifest   *manifest.Manifest
	Thresholds *manifest.Thresholds
	Corpus     []Prompt
	CorpusPath string

	// Set before the first spec runs.
	State     State
	API       *API
	Tokenizer *tokenizer.Tokenizer
	Endpoint  *launch.Endpoint
	// GPUs are this process's GPUs on a GPU run (its server's and the telemetry's), else nil.
	GPUs []gpu.Device

	loadReference func(string) (Reference, error)
	refOnce       sync.Once
	ref           Reference
	refErr        error
}

// NewSuite reads the family's manifest, thresholds and corpus and registers the suite's
// setup: SynchronizedBeforeSuite builds the binaries, the fixture checkpoint and the bundle
// through the content-keyed cache, refuses a bundle that does not match the manifest, and
// starts the one server of the suite (cleanup registered at once); an AfterEach attaches the
// server log tail and the artifact folder to every failed spec. Call it once, at package
// level of the family's suite file. It panics (failing the tree construction) on a bad
// manifest, threshold file or corpus, naming the file and field.
func NewSuite(in SuiteInput) *Suite {
	if err := CheckFamily(in.Family); err != nil {
		panic("spec.NewSuite: SuiteInput.Family: " + err.Error())
	}
	if in.Reference == nil {
		panic("spec.NewSuite: SuiteInput.Reference is nil; pass the family's reference loader")
	}
	if in.Dir == "" {
		in.Dir = "."
	}
	s := &Suite{Family: in.Family, Dir: in.Dir, loadReference: in.Reference}
	var err error
	if s.Manifest, err = manifest.Load(filepath.Join(in.Dir, "manifest.yaml")); err != nil {
		panic("spec.NewSuite: " + err.Error())
	}
	if s.Manifest.Family != in.Family {
		panic(fmt.Sprintf("spec.NewSuite: manifest family %q differs from SuiteInput.Family %q", s.Manifest.Family, in.Family))
	}
	if s.Thresholds, err = manifest.LoadThresholds(filepath.Join(in.Dir, "thresholds.yaml")); err != nil {
		panic("spec.NewSuite: " + err.Error())
	}
	s.CorpusPath = filepath.Join(in.Dir, "corpus.jsonl")
	if s.Corpus, err = LoadCorpus(s.CorpusPath); err != nil {
		panic("spec.NewSuite: " + err.Error())
	}
	if abs, err := filepath.Abs(s.CorpusPath); err == nil {
		s.CorpusPath = abs
	}
	ginkgo.SynchronizedBeforeSuite(s.setupOnce, s.setupEach)
	ginkgo.AfterEach(s.diagnose)
	ginkgo.ReportAfterSuite(in.Family+" gate verdicts", s.reportVerdicts)
	return s
}

// Labels are the family and owner labels every spec of the family carries.
func (s *Suite) Labels() ginkgo.Labels {
	return append(Family(s.Family), Owner(s.Manifest.Owner)...)
}

// Reference returns the family reference on the suite's checkpoint, loaded once per process.
func (s *Suite) Reference() (Reference, error) {
	s.refOnce.Do(func() {
		if s.State.Checkpoint == "" {
			s.refErr = fmt.Errorf("spec: the suite has no local checkpoint to load the %s reference from", s.Family)
			return
		}
		s.ref, s.refErr = s.loadReference(s.State.Checkpoint)
	})
	return s.ref, s.refErr
}

// Threshold returns the tolerances for the suite's backend: thresholds.yaml's gpu section on
// a cuda build (the manifest's, or a GPU run's) when present, else the top level.
func (s *Suite) Threshold() manifest.Thresholds {
	if (s.Manifest.Build.Backend == "cuda" || s.State.Device == "cuda") && s.Thresholds.GPU != nil {
		return *s.Thresholds.GPU
	}
	return *s.Thresholds
}

// ArtifactDir is a folder for one gate's artifacts inside the suite's artifact folder.
func (s *Suite) ArtifactDir(name string) string { return filepath.Join(s.State.Artifacts, name) }

func externalURL() string {
	if *urlFlag != "" {
		return *urlFlag
	}
	return envconfig.ExternalURL.Get()
}

// launcherKind picks the launcher: -modelqual.launcher or MODELQUAL_LAUNCHER, else external
// when -modelqual.url or MODELQUAL_EXTERNAL_URL is set, else container when the run's label filter selects container
// specs and not plain ones (`ginkgo --label-filter=container`), else process.
func launcherKind() (string, error) {
	k := *launcherFlag
	if k == "" {
		k = envconfig.Launcher.Get()
	}
	if k != "" {
		switch k {
		case "process", "container", "external":
			return k, nil
		}
		return "", fmt.Errorf("launcher %q (from -modelqual.launcher or %s): use process, container or external", k, envconfig.Launcher.Name)
	}
	if externalURL() != "" {
		return "external", nil
	}
	if f := ginkgo.GinkgoLabelFilter(); f != "" {
		if match, err := types.ParseLabelFilter(f); err == nil && match([]string{PlacementContainer}) && !match([]string{}) && !match([]string{PlacementPremerge}) {
			return "container", nil
		}
	}
	return "process", nil
}

func (s *Suite) setupOnce(ctx ginkgo.SpecContext) []byte {
	st, err := s.prepare(ctx)
	if err != nil {
		ginkgo.Fail(err.Error())
	}
	b, err := json.Marshal(st)
	if err != nil {
		ginkgo.Fail(fmt.Sprintf("spec: encode suite state: %v", err))
	}
	return b
}

func (s *Suite) prepare(ctx context.Context) (State, error) {
	st := State{Model: s.Family}
	root, err := fixtures.RepoRoot()
	if err != nil {
		return st, err
	}
	st.RepoRoot = root
	if st.Launcher, err = launcherKind(); err != nil {
		return st, err
	}
	base := envconfig.Artifacts.Get()
	if base == "" {
		base = filepath.Join(root, "artifacts", "specs")
	}
	st.Artifacts, _ = filepath.Abs(filepath.Join(base, s.Family))
	// The family's own artifact folder is recreated so that a report never mixes runs.
	_ = os.RemoveAll(st.Artifacts)
	if err := os.MkdirAll(st.Artifacts, 0o755); err != nil {
		return st, fmt.Errorf("spec: create artifact folder: %w", err)
	}
	if s.gpuRun() && st.Launcher != "external" {
		inv := gpu.Inspect()
		if !inv.Available {
			st.GPUSkip = inv.Reason
			fmt.Fprintf(os.Stderr, "modelqual %s: GPU run without a GPU: %s; the gpu specs skip\n", s.Family, inv.Reason)
			return st, nil
		}
		st.Device = "cuda"
		owned := ""
		if s.Thresholds.GPU != nil {
			owned = s.Thresholds.GPU.Precision
		}
		if st.Precision, err = gpuPrecision(owned); err != nil {
			return st, err
		}
	}
	cache := fixtures.DefaultCacheDir()
	if st.Checkpoint, st.Revision, err = s.checkpoint(cache); err != nil {
		return st, err
	}
	opts := s.serverOptions(filepath.Join(st.Artifacts, "server"))
	switch st.Launcher {
	case "external":
		st.BaseURL = externalURL()
		if st.BaseURL == "" {
			return st, fmt.Errorf("spec: the external launcher needs -modelqual.url or %s=http://host:port", envconfig.ExternalURL.Name)
		}
		if m := envconfig.ExternalModel.Get(); m != "" {
			st.Model = m
		}
		st.APIKey = envconfig.APIKey.Get()
		opts = append(opts, launch.WithURL(st.BaseURL), launch.WithModel(st.Model), launch.WithAPIKey(st.APIKey))
	default:
		if err := BuildBinaries(ctx, root, binDir(root)); err != nil {
			return st, err
		}
		if st.Bundle, st.BundleDigest, err = s.bundle(ctx, cache, st); err != nil {
			return st, err
		}
		opts = append(opts, launch.WithBundle(st.Bundle), launch.WithServerBin(filepath.Join(binDir(root), "qual-server")))
	}
	if st.Device == "cuda" {
		// Every process starts its own server on its own GPUs (setupEach).
		return st, nil
	}
	ep, err := s.start(ctx, st, opts)
	if err != nil {
		return st, err
	}
	st.setEndpoint(ep)
	if st.Launcher == "external" {
		// Identity first: no gate runs against a server that serves another checkpoint.
		if err := s.checkExternal(ctx, &st); err != nil {
			return st, err
		}
	}
	return st, nil
}

// checkExternal runs the identity check (CheckIdentity) against an external server, adopts
// the model name it lists, and prints what the server offers beyond OpenAI's routes, so a
// reader sees at once why some gates skip.
func (s *Suite) checkExternal(ctx context.Context, st *State) error {
	in := IdentityInput{API: NewAPI(st.BaseURL, st.Model, st.APIKey, s.Manifest.Server.RequestTimeout.Duration),
		Checkpoint: s.Manifest.Checkpoint.ID + "@" + st.Revision, ModelGiven: envconfig.ExternalModel.Get() != ""}
	if g, err := LoadGolden(GoldenPath(st.RepoRoot, s.goldenFixture())); err == nil && len(g.Prompts) > 0 {
		tok, err := tokenizer.Load(st.Checkpoint)
		if err != nil {
			return fmt.Errorf("spec: load the %s tokenizer from %s for the identity check: %w", s.Family, st.Checkpoint, err)
		}
		in.Golden, in.Tokenizer = g, tok
		in.API.TextPrompt = TextPrompt(tok)
		if tg, err := LoadGolden(filepath.Join(st.RepoRoot, "fixtures", "golden", s.goldenFixture()+"-text.json")); err == nil && len(tg.Prompts) > 0 {
			in.TextGolden = tg
		}
	}
	res, err := CheckIdentity(ctx, in)
	if err != nil {
		return fmt.Errorf("spec: %s stops before any gate: %w", s.Family, err)
	}
	st.Model = res.Model
	api := NewAPI(st.BaseURL, st.Model, st.APIKey, s.Manifest.Server.RequestTimeout.Duration)
	api.TextPrompt = in.API.TextPrompt // so the summary says whether token-array prompts are taken
	caps, err := api.Capabilities(ctx)
	if err != nil {
		return fmt.Errorf("spec: probe what the server at %s offers: %w", st.BaseURL, err)
	}
	fmt.Fprintf(os.Stderr, "modelqual %s: the server at %s serves %s (model %q; checked: %s)\nmodelqual %s: beyond OpenAI's routes it offers:\n%s",
		s.Family, st.BaseURL, in.Checkpoint, st.Model, res.Fingerprint, s.Family, caps.Summary())
	return nil
}

// setEndpoint records where a started server listens and how it was started.
func (st *State) setEndpoint(ep *launch.Endpoint) {
	st.BaseURL, st.Model, st.RecordsPath, st.LogPaths = ep.BaseURL, ep.Model, ep.RecordsPath, ep.LogPaths
	st.PID, st.Args, st.Env = ep.PID, ep.Args, ep.Env
}

// serverOptions are the launcher options every server of the suite shares: the model name,
// the run directory, the manifest's server settings and the faults to plant.
func (s *Suite) serverOptions(runDir string) []launch.Option {
	opts := []launch.Option{
		launch.WithModel(s.Family),
		launch.WithRunDir(runDir),
		launch.WithStartupTimeout(s.Manifest.Server.StartupTimeout.Duration),
		launch.WithArgs("--workers", strconv.Itoa(s.Manifest.Server.Workers),
			"--request-timeout", s.Manifest.Server.RequestTimeout.Duration.String()),
	}
	if s.Manifest.Build.MaxBatch > 0 {
		opts = append(opts, launch.WithArgs("--max-batch", strconv.Itoa(s.Manifest.Build.MaxBatch)))
	}
	if f := envconfig.Faults.Get(); f != "" {
		opts = append(opts, launch.WithFaults(f))
	}
	return opts
}

// start starts a server with the launcher of st and registers its cleanup the moment
// anything started.
func (s *Suite) start(ctx context.Context, st State, opts []launch.Option) (*launch.Endpoint, error) {
	l, err := launch.New(st.Launcher, opts...)
	if err != nil {
		return nil, err
	}
	ep, err := l.Start(ctx)
	if ep != nil {
		// Cleanup is registered the moment something started; it runs after every spec of
		// every process, when the suite ends.
		ginkgo.DeferCleanup(func(ctx context.Context) error { return ep.Stop(ctx) }, ginkgo.NodeTimeout(time.Minute))
	}
	if err != nil {
		return ep, fmt.Errorf("spec: start the %s server for %s: %w", st.Launcher, s.Family, err)
	}
	return ep, nil
}

func (s *Suite) setupEach(ctx ginkgo.SpecContext, data []byte) {
	if err := json.Unmarshal(data, &s.State); err != nil {
		ginkgo.Fail(fmt.Sprintf("spec: decode suite state: %v", err))
	}
	if s.State.GPUSkip != "" {
		return // no server: every gpu spec skips (RequireGPU)
	}
	if s.State.Device == "cuda" {
		if err := s.startGPUServer(ctx, &s.State); err != nil {
			ginkgo.Fail(err.Error())
		}
		if s.State.GPUSkip != "" {
			return // this process holds no GPU: its gpu specs skip (RequireGPU)
		}
	}
	st := s.State
	s.API = NewAPI(st.BaseURL, st.Model, st.APIKey, s.Manifest.Server.RequestTimeout.Duration)
	s.Endpoint = &launch.Endpoint{BaseURL: st.BaseURL, Model: st.Model, Kind: st.Launcher,
		LogPaths: st.LogPaths, RecordsPath: st.RecordsPath, PID: st.PID, Args: st.Args, Env: st.Env}
	tokDir := st.Checkpoint
	if _, err := os.Stat(filepath.Join(tokDir, "model_index.json")); err == nil {
		tokDir = filepath.Join(tokDir, "tokenizer") // a diffusers pipeline folder
	}
	tok, err := tokenizer.Load(tokDir)
	if err != nil {
		ginkgo.Fail(fmt.Sprintf("spec: load the %s tokenizer from %s: %v", s.Family, st.Checkpoint, err))
	}
	s.Tokenizer = tok
	if st.Launcher == "external" {
		// A server this harness did not start may take text prompts only (Ollama): golden
		// ids then travel as their text (TextPrompt), probed once on the first such request.
		s.API.TextPrompt = TextPrompt(tok)
	}
}

// diagnose attaches what a failed spec's reader needs: the server's log tail and where the
// artifacts (logs, records, run directories) are. It runs before the suite's cleanup stops
// the server, so the logs are complete up to the failure.
func (s *Suite) diagnose() {
	if !ginkgo.CurrentSpecReport().Failed() {
		return
	}
	ginkgo.AddReportEntry("artifacts", s.State.Artifacts)
	for _, p := range s.State.LogPaths {
		if tail := fileTail(p, 40); tail != "" {
			ginkgo.AddReportEntry("server log tail "+filepath.Base(p), tail)
		}
	}
}

func fileTail(path string, lines int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	ls := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(ls) > lines {
		ls = ls[len(ls)-lines:]
	}
	return strings.Join(ls, "\n")
}

// checkpoint makes the manifest's checkpoint available locally: the generated fixture
// (whose content-derived revision must equal the manifest's pin) or a snapshot of a real hub
// cache.
func (s *Suite) checkpoint(cache string) (dir, rev string, err error) {
	c := s.Manifest.Checkpoint
	if c.Fixture != "" {
		dir, rev, err = fixtures.Ensure(cache, c.Fixture)
		if err != nil {
			return "", "", fmt.Errorf("spec: generate fixture %s: %w", c.Fixture, err)
		}
		if rev != c.Revision {
			return "", "", fmt.Errorf("spec: fixture %s now generates revision %s but %s pins checkpoint.revision %s; the fixture generator changed: check why, then update the pin",
				c.Fixture, rev, s.Manifest.Path(), c.Revision)
		}
		return dir, rev, nil
	}
	hub := envconfig.HubCache.Get()
	if hub == "" {
		hub = envconfig.HFHubCache.Get()
	}
	if hub == "" {
		home, _ := os.UserHomeDir()
		hub = filepath.Join(home, ".cache", "huggingface", "hub")
	}
	dir, rev, err = bundle.ResolveHubCache(hub, c.ID, c.Revision)
	if err != nil {
		return "", "", fmt.Errorf("spec: checkpoint %s@%s from hub cache %s (set %s): %w", c.ID, c.Revision, hub, envconfig.HubCache.Name, err)
	}
	return dir, rev, nil
}

// bundle returns the bundle for the manifest's checkpoint and build settings from the
// content-keyed cache, building it on a miss, and refuses it, before any server starts, when
// its header does not match the manifest.
func (s *Suite) bundle(ctx context.Context, cache string, st State) (path, sum string, err error) {
	m := s.buildManifest(st)
	checkpointDir, revision := st.Checkpoint, st.Revision
	key, err := bundleKey(m, revision)
	if err != nil {
		return "", "", err
	}
	path = filepath.Join(cache, "bundles", fmt.Sprintf("%s-%s.mqb", strings.ReplaceAll(m.Checkpoint.ID, "/", "--"), key[:16]))
	unlock, err := lockFile(filepath.Join(cache, "locks", "bundle-"+key[:16]+".lock"))
	if err != nil {
		return "", "", err
	}
	defer unlock()
	if _, statErr := os.Stat(path); statErr != nil {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return "", "", fmt.Errorf("spec: bundle cache: %w", err)
		}
		o := bundle.BuildOptions{CheckpointDir: checkpointDir, Model: m.Checkpoint.ID, Revision: revision, Out: path,
			Precision: m.Build.Precision, MaxContext: m.Build.MaxContext, MaxBatch: m.Build.MaxBatch, Backend: m.Build.Backend}
		if err := s.buildBundle(ctx, st, o); err != nil {
			return "", "", fmt.Errorf("spec: build the %s bundle: %w", s.Family, err)
		}
		// Superseded bundles of this checkpoint (another builder source or build settings)
		// would pile up at tens of megabytes each; a server still serving one keeps its
		// mapping after the unlink.
		old, _ := filepath.Glob(filepath.Join(filepath.Dir(path), strings.ReplaceAll(m.Checkpoint.ID, "/", "--")+"-*.mqb"))
		for _, o := range old {
			if o != path {
				_ = os.Remove(o)
			}
		}
	}
	b, err := bundle.Open(path)
	if err != nil {
		return "", "", fmt.Errorf("spec: open cached bundle (delete it to rebuild): %w", err)
	}
	defer b.Close()
	if err := CheckHeader(b.Header(), m); err != nil {
		return "", "", fmt.Errorf("spec: refusing to serve bundle %s: %w", path, err)
	}
	return path, b.Digest(), nil
}

// buildBundle builds o. A generated fixture knows its own family, so its bundle is built here;
// a real checkpoint's family comes from the runtime's registry, which only the qual binary
// links, so `qual bundle build` builds it.
func (s *Suite) buildBundle(ctx context.Context, st State, o bundle.BuildOptions) error {
	if fx := s.Manifest.Checkpoint.Fixture; fx != "" {
		r, err := fixtures.Resolver(fx)
		if err != nil {
			return err
		}
		o.Resolve = r
		_, err = bundle.Build(ctx, o)
		return err
	}
	args := []string{"bundle", "build", "--checkpoint", o.CheckpointDir, "--model", o.Model, "--revision", o.Revision, "--out", o.Out,
		"--precision", o.Precision, "--max-context", strconv.Itoa(o.MaxContext), "--max-batch", strconv.Itoa(o.MaxBatch), "--backend", o.Backend}
	if o.Precision == "" {
		args[12] = "fp32"
	}
	if o.Backend == "" {
		args[len(args)-1] = "cpu"
	}
	cmd := exec.CommandContext(ctx, filepath.Join(binDir(st.RepoRoot), "qual"), args...)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("qual %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return nil
}

// bundleKey is the content key of a bundle: the checkpoint identity and revision, the build
// settings, the bundle format version and the bundle builder's source, so any change to what
// would be built yields a new key.
func bundleKey(m *manifest.Manifest, revision string) (string, error) {
	h := sha256.New()
	fmt.Fprintf(h, "format=%d\nid=%s\nrev=%s\nprecision=%s\nctx=%d\nbatch=%d\nbackend=%s\n", bundle.FormatVersion,
		m.Checkpoint.ID, revision, m.Build.Precision, m.Build.MaxContext, m.Build.MaxBatch, m.Build.Backend)
	root, err := fixtures.RepoRoot()
	if err != nil {
		return "", err
	}
	files, _ := filepath.Glob(filepath.Join(root, "native", "bundle", "*.go"))
	sort.Strings(files)
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			return "", err
		}
		fmt.Fprintf(h, "%s %d\n", filepath.Base(f), len(b))
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

func binDir(root string) string {
	if d := envconfig.Bin.Get(); d != "" {
		return d
	}
	return filepath.Join(root, "bin")
}

// BuildBinaries runs `go build` of qual and qual-server into dir. The go command rebuilds only
// what changed and leaves an up-to-date binary alone, so this is cheap when nothing changed
// and never serves a stale binary. Where no go command exists (a GPU runner), the prebuilt
// binaries already in dir are used as they are, whatever their age. A file lock serializes
// suites building at once (ginkgo -p over several families).
func BuildBinaries(ctx context.Context, root, dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("spec: create %s: %w", dir, err)
	}
	unlock, err := lockFile(filepath.Join(dir, ".build.lock"))
	if err != nil {
		return err
	}
	defer unlock()
	if _, err := exec.LookPath("go"); err != nil {
		// A GPU runner often has no Go toolchain: binaries built elsewhere and placed in dir
		// (MODELQUAL_BIN) are used as they are, and said so.
		q, s := filepath.Join(dir, "qual"), filepath.Join(dir, "qual-server")
		if isExecutable(q) && isExecutable(s) {
			fmt.Fprintf(os.Stderr, "modelqual: no go command on PATH; using the prebuilt %s and %s\n", q, s)
			return nil
		}
		return fmt.Errorf("spec: no go command on PATH to build qual and qual-server, and %s lacks prebuilt ones: install Go, or build them elsewhere (go build -o DIR/ ./qual/cmd/qual ./server/cmd/qual-server) and set MODELQUAL_BIN=DIR", dir)
	}
	cmd := exec.CommandContext(ctx, "go", "build", "-o", dir+string(os.PathSeparator), "./qual/cmd/qual", "./server/cmd/qual-server")
	cmd.Dir = root
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("spec: go build ./qual/cmd/qual ./server/cmd/qual-server into %s: %w\n%s", dir, err, out)
	}
	return nil
}

// lockFile takes an exclusive flock on path (created if needed) and returns its release.
func lockFile(path string) (func(), error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("spec: lock %s: %w", path, err)
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("spec: lock %s: %w", path, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("spec: lock %s: %w", path, err)
	}
	return func() { _ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN); f.Close() }, nil
}

// StartServer starts a second server of the suite's bundle with extra environment (such as
// MODELQUAL_FAULTS=qwen3.drop_q_norm, planting a defect to prove a gate bites) and returns an
// API for it and its endpoint; it is stopped when the calling spec ends. It needs a bundle, so
// it skips the spec under the external launcher, which qualifies a server it did not build.
func (s *Suite) StartServer(ctx context.Context, env ...string) (*API, *launch.Endpoint) {
	ginkgo.GinkgoHelper()
	return s.StartServerArgs(ctx, nil, env...)
}

// StartServerArgs is StartServer with extra qual-server flags (after the suite's own, so they
// win), such as a short --request-timeout for the failure-records gate.
func (s *Suite) StartServerArgs(ctx context.Context, args []string, env ...string) (*API, *launch.Endpoint) {
	ginkgo.GinkgoHelper()
	if s.State.Bundle == "" {
		ginkgo.Skip(fmt.Sprintf("%splants a defect in a server the harness starts from the suite's bundle; the %s launcher has none", NotCheckable, s.State.Launcher))
	}
	name := strings.NewReplacer("/", "-", " ", "-", "=", "-", ",", "-").Replace(ginkgo.CurrentSpecReport().LeafNodeText)
	if len(name) > 60 {
		name = name[:60]
	}
	l := launch.Process(launch.WithBundle(s.State.Bundle), launch.WithModel(s.State.Model),
		launch.WithServerBin(filepath.Join(binDir(s.State.RepoRoot), "qual-server")),
		launch.WithRunDir(filepath.Join(s.State.Artifacts, "servers", name)),
		launch.WithStartupTimeout(s.Manifest.Server.StartupTimeout.Duration),
		launch.WithArgs("--workers", "1", "--request-timeout", s.Manifest.Server.RequestTimeout.Duration.String()),
		launch.WithArgs(args...), launch.WithEnv(env...))
	ep, err := l.Start(ctx)
	if ep != nil {
		ginkgo.DeferCleanup(func(ctx context.Context) error { return ep.Stop(ctx) }, ginkgo.NodeTimeout(time.Minute))
	}
	gomega.Expect(err).NotTo(gomega.HaveOccurred(), "start a server with %v", env)
	return NewAPI(ep.BaseURL, ep.Model, "", s.Manifest.Server.RequestTimeout.Duration), ep
}

// RequireLauncher skips the calling spec unless the suite's server was started by the named
// launcher: the container specs run the gates again against the server image only when the
// run selected container specs (`ginkgo --label-filter=container`), not against a process.
func (s *Suite) RequireLauncher(kind string) {
	if s.State.Launcher != kind {
		ginkgo.Skip(fmt.Sprintf("needs the %s launcher; this run's server came from the %s launcher (select container specs alone with --label-filter=container, or set %s)",
			kind, s.State.Launcher, envconfig.Launcher.Name))
	}
}

// isExecutable reports whether path is a regular file with an execute bit.
func isExecutable(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0
}
