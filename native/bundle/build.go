package bundle

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"
)

// Defaults applied by Build when an option is zero.
const (
	DefaultMaxBatch = 16
	// MaxDefaultContext caps the default max context (config's max_position_embeddings) so a
	// 40k-position checkpoint does not size its KV cache for 40k tokens unless asked to.
	MaxDefaultContext = 4096
	DefaultMockVocab  = 50257
	DefaultMockID     = "modelqual/mock"
)

// BuildOptions selects what to build. Exactly one of CheckpointDir, HubCache or Mock.
type BuildOptions struct {
	CheckpointDir string // a checkpoint directory (config.json, *.safetensors, tokenizer files)
	HubCache      string // a Hugging Face hub cache (the dir holding models--ORG--NAME, or its parent)
	Model         string // ORG/NAME recorded in provenance; inferred from a hub snapshot path when empty
	Revision      string // 40-hex commit; optional with HubCache (refs/main is resolved)
	Out           string // bundle file to write (written to a temporary file beside it, then renamed)
	Precision     string // fp32 (default) | bf16 | fp16 (the latter two only with backend cuda)
	MaxContext    int    // default: config max_position_embeddings capped at MaxDefaultContext
	MaxBatch      int    // default DefaultMaxBatch
	Backend       string // cpu (default) | cuda
	Mock          bool
	MockStepDelay time.Duration
	MockVocab     int // default DefaultMockVocab (the gpt2 tokenizer's size)
	// TokenizerDir holds tokenizer.json and tokenizer_config.json for a mock bundle (the mock
	// detokenizes with a real tokenizer). Pass the gpt2-tiny fixture snapshot
	// (fixtures.Ensure(cache, "gpt2-tiny")); fixtures.MockBundle does this for you.
	TokenizerDir string
	// Resolve says which runtime family serves the checkpoint's architecture (required for a
	// checkpoint): native.BundleFamily asks the runtime's registry (qual bundle build passes
	// it); a fixture generator that knows its own family may answer itself.
	Resolve Resolver
}

// Family is what the runtime says of a checkpoint: the family that serves its architecture, the
// task it serves and the model's position limit (the default max context; 0 when it has none).
type Family struct {
	Name         string
	Task         string
	MaxPositions int
	// Layout is what the family reads (native.Layout). With it, Build renames the checkpoint's
	// tensors to the names the family reads, leaves out what the reference loader discards, and
	// refuses a checkpoint missing a tensor, holding one of another shape, or holding one the
	// family never reads, so a bundle that builds opens. Without it the tensors are taken as
	// they are named (a fixture that knows its own layout).
	Layout *Layout
}

// Resolver maps a checkpoint's architecture (config.json's architectures[0], or a diffusers
// pipeline's model_index.json _class_name) and its config to the runtime family that serves it,
// or refuses it with an error that names what is unsupported.
type Resolver func(architecture string, config json.RawMessage) (Family, error)

// SourceRevision and SourceDirty may be set at link time
// (-ldflags "-X github.com/modelqual/modelqual/native/bundle.SourceRevision=<sha>") when the
// binary is built outside a git checkout; otherwise the Go build info or `git` is asked.
var (
	SourceRevision string
	SourceDirty    string // "true" or "false"
)

// Build converts a checkpoint (or the mock) into a bundle at o.Out and returns its header.
// The file is streamed: tensors are converted as they are written and hashed on other cores
// meanwhile (as are the checkpoint's shards, for provenance), so memory stays small whatever
// the checkpoint size.
func Build(ctx context.Context, o BuildOptions) (*Header, error) {
	if o.Out == "" {
		return nil, errors.New("bundle: BuildOptions.Out is empty; pass --out FILE")
	}
	if o.Precision == "" {
		o.Precision = "fp32"
	}
	if o.Backend == "" {
		o.Backend = "cpu"
	}
	if err := checkPrecisionBackend(o.Precision, o.Backend); err != nil {
		return nil, fmt.Errorf("bundle: %v", err)
	}
	if o.MaxBatch == 0 {
		o.MaxBatch = DefaultMaxBatch
	}
	if o.MaxBatch < 0 || o.MaxContext < 0 {
		return nil, fmt.Errorf("bundle: max batch %d and max context %d must not be negative", o.MaxBatch, o.MaxContext)
	}
	if o.MockStepDelay < 0 {
		return nil, fmt.Errorf("bundle: mock step delay %v is negative", o.MockStepDelay)
	}
	n := 0
	for _, set := range []bool{o.CheckpointDir != "", o.HubCache != "", o.Mock} {
		if set {
			n++
		}
	}
	if n != 1 {
		return nil, errors.New("bundle: pass exactly one of --checkpoint DIR, --hub-cache DIR or --mock")
	}
	var src *source
	var err error
	if o.Mock {
		src, err = mockSource(o)
	} else {
		src, err = checkpointSource(o)
	}
	if err != nil {
		return nil, err
	}
	return write(ctx, o, src)
}

// source is everything read from the input before writing.
type source struct {
	family, task, arch string
	id, revision       string
	config, genCfg     []byte
	tokenizer, tokCf   []byte
	optional           map[string][]byte // OptionalSections present in the checkpoint
	tensors            []stTensor
	files              map[string]string // checkpoint file -> sha256, but for shards
	skipped            []string
	renamed            []string // the layout's renames that applied (Provenance.RenamedTensors)
	maxContext         int
	// shards are the safetensors files. Their sha256s join files in write, which computes them
	// while it writes the bundle: hashing gigabytes takes as long as a good part of the writing.
	shards []shardFile
}

// ResolveHubCache finds a model's snapshot in a Hugging Face hub cache. cacheDir may be the
// hub directory itself (holding models--ORG--NAME) or its parent (holding hub/). An empty
// revision resolves refs/main; a branch name is refused because it is not immutable.
func ResolveHubCache(cacheDir, model, revision string) (snapshotDir, revision40 string, err error) {
	if !validCheckpointID(model) {
		return "", "", fmt.Errorf("bundle: model %q is not of the form ORG/NAME; pass --model ORG/NAME", model)
	}
	if revision != "" && !hex40.MatchString(revision) {
		return "", "", notImmutable(revision)
	}
	repo := "models--" + strings.ReplaceAll(model, "/", "--")
	var modelDir string
	for _, d := range []string{filepath.Join(cacheDir, repo), filepath.Join(cacheDir, "hub", repo)} {
		if st, err := os.Stat(d); err == nil && st.IsDir() {
			modelDir = d
			break
		}
	}
	if modelDir == "" {
		return "", "", fmt.Errorf("bundle: hub cache %s has no %s (looked in it and in its hub/); download the model or pass --checkpoint DIR", cacheDir, repo)
	}
	if revision == "" {
		ref, err := os.ReadFile(filepath.Join(modelDir, "refs", "main"))
		if err != nil {
			return "", "", fmt.Errorf("bundle: hub cache %s: cannot resolve refs/main: %v; pass --revision <40-hex commit>", modelDir, err)
		}
		revision = strings.TrimSpace(string(ref))
		if !hex40.MatchString(revision) {
			return "", "", fmt.Errorf("bundle: hub cache %s: refs/main holds %q, not a 40-hex commit", modelDir, revision)
		}
	}
	snap := filepath.Join(modelDir, "snapshots", revision)
	if st, err := os.Stat(snap); err != nil || !st.IsDir() {
		return "", "", fmt.Errorf("bundle: hub cache %s has no snapshot %s; check --revision", modelDir, revision)
	}
	return snap, revision, nil
}

// modelFromSnapshotPath infers ORG/NAME from a hub-cache snapshot path
// (.../models--ORG--NAME/snapshots/<rev>), or returns "".
func modelFromSnapshotPath(dir string) string {
	abs, err := filepath.Abs(dir)
	if err != nil || filepath.Base(filepath.Dir(abs)) != "snapshots" {
		return ""
	}
	repo := filepath.Base(filepath.Dir(filepath.Dir(abs)))
	org, name, ok := strings.Cut(strings.TrimPrefix(repo, "models--"), "--")
	if !strings.HasPrefix(repo, "models--") || !ok {
		return ""
	}
	return org + "/" + name
}

func notImmutable(rev string) error {
	return fmt.Errorf("bundle: checkpoint revision %q is not immutable; pass a 40-hex commit", rev)
}

func checkpointSource(o BuildOptions) (*source, error) {
	if o.Resolve == nil {
		return nil, errors.New("bundle: BuildOptions.Resolve is nil; pass the runtime's resolver (native.BundleFamily), which says which family serves the checkpoint")
	}
	if o.Model == "" && o.CheckpointDir != "" {
		o.Model = modelFromSnapshotPath(o.CheckpointDir)
	}
	if !validCheckpointID(o.Model) {
		return nil, fmt.Errorf("bundle: model %q is not of the form ORG/NAME; pass --model ORG/NAME", o.Model)
	}
	dir, rev := o.CheckpointDir, o.Revision
	if o.HubCache != "" {
		var err error
		if dir, rev, err = ResolveHubCache(o.HubCache, o.Model, o.Revision); err != nil {
			return nil, err
		}
	} else if rev == "" {
		// A snapshot directory of a hub cache names its own revision.
		abs, _ := filepath.Abs(dir)
		if base := filepath.Base(abs); hex40.MatchString(base) && filepath.Base(filepath.Dir(abs)) == "snapshots" {
			rev = base
		} else {
			return nil, fmt.Errorf("bundle: checkpoint %s: no revision; pass --revision <40-hex commit>", dir)
		}
	} else if !hex40.MatchString(rev) {
		return nil, notImmutable(rev)
	}
	s := &source{id: o.Model, revision: rev, files: map[string]string{}, optional: map[string][]byte{}}
	read := func(name string, required bool) ([]byte, error) {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			if !required && errors.Is(err, os.ErrNotExist) {
				return nil, nil
			}
			return nil, fmt.Errorf("bundle: checkpoint %s: %s: %v", dir, name, err)
		}
		s.files[name] = sum(b)
		return b, nil
	}
	var err error
	pipeline, err := read("model_index.json", false)
	if err != nil {
		return nil, err
	}
	tokDir := ""
	if pipeline != nil {
		if err := s.readPipeline(dir, pipeline, read); err != nil {
			return nil, err
		}
		tokDir = "tokenizer/"
	} else {
		if s.config, err = read("config.json", true); err != nil {
			return nil, err
		}
		if !isObject(s.config) {
			return nil, fmt.Errorf("bundle: checkpoint %s: config.json is not a JSON object", dir)
		}
		if s.arch, err = architecture(s.config); err != nil {
			return nil, fmt.Errorf("bundle: checkpoint %s: %v", dir, err)
		}
		if err := s.readTensors(dir, "", read); err != nil {
			return nil, err
		}
	}
	fam, err := o.Resolve(s.arch, s.config)
	if err != nil {
		return nil, fmt.Errorf("bundle: checkpoint %s: %v", dir, err)
	}
	if !slices.Contains(Tasks, fam.Task) || !familyName.MatchString(fam.Name) {
		return nil, fmt.Errorf("bundle: checkpoint %s: the resolver answered family %q, task %q; want a family name and one of %v", dir, fam.Name, fam.Task, Tasks)
	}
	s.family, s.task = fam.Name, fam.Task
	if fam.Layout != nil {
		if err := s.applyLayout(dir, fam); err != nil {
			return nil, err
		}
	}
	if s.tokenizer, err = read(tokDir+"tokenizer.json", tokDir == ""); err != nil {
		return nil, err
	}
	if s.tokenizer == nil { // a pipeline's tokenizer/ as vocab.json + merges.txt (CLIP's, in FLUX.1)
		for _, name := range []string{SectionVocab, SectionMerges} {
			b, err := read(tokDir+name, false)
			if err != nil {
				return nil, err
			}
			if b == nil {
				return nil, fmt.Errorf("bundle: checkpoint %s: %s has neither tokenizer.json nor vocab.json and merges.txt", dir, tokDir)
			}
			s.optional[name] = b
		}
		s.tokenizer = []byte{}
	}
	if pipeline != nil { // a second tokenizer for a second text encoder (FLUX.1's T5 in tokenizer_2/)
		for _, name := range []string{SectionTokenizer2, SectionTokenizer2Config} {
			b, err := read(name, false)
			if err != nil {
				return nil, err
			}
			if b != nil {
				s.optional[name] = b
			}
		}
	}
	if s.tokCf, err = read(tokDir+"tokenizer_config.json", true); err != nil {
		return nil, err
	}
	for _, name := range []string{SectionPreprocessorConfig, SectionChatTemplate, SectionChatTemplateJSON} {
		b, err := read(tokDir+name, false)
		if err != nil {
			return nil, err
		}
		if b == nil && tokDir != "" {
			if b, err = read(name, false); err != nil {
				return nil, err
			}
		}
		if b != nil {
			s.optional[name] = b
		}
	}
	// transformers 5 may save a processor's image settings only in processor_config.json's
	// image_processor block; without a preprocessor_config.json that file is the section (the
	// image processors of server/vision read either form).
	if _, ok := s.optional[SectionPreprocessorConfig]; !ok {
		b, err := read("processor_config.json", false)
		if err != nil {
			return nil, err
		}
		if b != nil && bytes.Contains(b, []byte(`"image_processor"`)) {
			s.optional[SectionPreprocessorConfig] = b
		}
	}
	if pipeline == nil {
		if s.genCfg, err = read("generation_config.json", false); err != nil {
			return nil, err
		}
	}
	if s.genCfg == nil {
		// As transformers does, derive the generation defaults from config.json.
		s.genCfg, err = deriveGenerationConfig(s.config)
		if err != nil {
			return nil, fmt.Errorf("bundle: checkpoint %s: %v", dir, err)
		}
	} else if !isObject(s.genCfg) {
		return nil, fmt.Errorf("bundle: checkpoint %s: generation_config.json is not a JSON object", dir)
	}
	limit := int64(fam.MaxPositions)
	s.maxContext = o.MaxContext
	switch {
	case s.maxContext == 0 && limit > 0:
		s.maxContext = int(min(limit, MaxDefaultContext))
	case s.maxContext == 0:
		s.maxContext = MaxDefaultContext
	case limit > 0 && int64(s.maxContext) > limit:
		return nil, fmt.Errorf("bundle: --max-context %d exceeds the position limit %d of %s (family %s)", s.maxContext, limit, dir, s.family)
	}
	return s, nil
}

// architecture returns the single architecture of config.architectures.
func architecture(config json.RawMessage) (string, error) {
	var c struct {
		Architectures []string `json:"architectures"`
	}
	if err := json.Unmarshal(config, &c); err != nil {
		return "", fmt.Errorf("config.architectures: %v", err)
	}
	if len(c.Architectures) != 1 || c.Architectures[0] == "" {
		return "", fmt.Errorf("config.architectures is %q, want exactly one architecture", c.Architectures)
	}
	return c.Architectures[0], nil
}

// readPipeline reads a diffusers pipeline folder: model_index.json names the pipeline class and
// its components; each component with a config (config.json, or a scheduler's
// scheduler_config.json) joins the bundle's config under its name, and its weights
// (<component>/*.safetensors) join the tensors with "<component>." before their names. The
// tokenizer comes from tokenizer/ (and a second one from tokenizer_2/).
func (s *source) readPipeline(dir string, index []byte, read func(string, bool) ([]byte, error)) error {
	var idx map[string]json.RawMessage
	if err := json.Unmarshal(index, &idx); err != nil || idx == nil {
		return fmt.Errorf("bundle: checkpoint %s: model_index.json is not a JSON object", dir)
	}
	if err := json.Unmarshal(idx["_class_name"], &s.arch); err != nil || s.arch == "" {
		return fmt.Errorf("bundle: checkpoint %s: model_index.json has no _class_name (the pipeline class)", dir)
	}
	merged := map[string]json.RawMessage{"model_index": json.RawMessage(compactJSON(index))}
	var comps []string
	for k, v := range idx {
		var pair []any
		if strings.HasPrefix(k, "_") || json.Unmarshal(v, &pair) != nil || len(pair) != 2 || pair[0] == nil {
			continue // metadata, or a component the pipeline leaves out ([null, null])
		}
		comps = append(comps, k)
	}
	sort.Strings(comps)
	for _, c := range comps {
		if strings.HasPrefix(c, "tokenizer") { // tokenizer/, tokenizer_2/: read as tokenizer sections
			continue
		}
		var cfg []byte
		for _, name := range []string{c + "/config.json", c + "/scheduler_config.json"} {
			b, err := read(name, false)
			if err != nil {
				return err
			}
			if b != nil {
				cfg = b
				break
			}
		}
		if cfg == nil {
			return fmt.Errorf("bundle: checkpoint %s: component %s has neither %s/config.json nor %s/scheduler_config.json", dir, c, c, c)
		}
		if !isObject(cfg) {
			return fmt.Errorf("bundle: checkpoint %s: %s's config is not a JSON object", dir, c)
		}
		merged[c] = json.RawMessage(compactJSON(cfg))
		if m, _ := filepath.Glob(filepath.Join(dir, c, "*.safetensors")); len(m) > 0 {
			if err := s.readTensors(filepath.Join(dir, c), c+"/", read); err != nil {
				return err
			}
		}
	}
	var err error
	if s.config, err = json.Marshal(merged); err != nil {
		return fmt.Errorf("bundle: checkpoint %s: %v", dir, err)
	}
	s.genCfg = []byte("{}")
	return nil
}

func deriveGenerationConfig(config []byte) ([]byte, error) {
	var c map[string]json.RawMessage
	if err := json.Unmarshal(config, &c); err != nil {
		return nil, err
	}
	g := map[string]json.RawMessage{}
	for _, k := range []string{"bos_token_id", "eos_token_id", "pad_token_id"} {
		if v, ok := c[k]; ok {
			g[k] = v
		}
	}
	return json.Marshal(g)
}

// readTensors lists the tensors of dir's model.safetensors.index.json shards (or of its
// diffusion_pytorch_model.safetensors.index.json), or of every *.safetensors file. A tensor the
// index puts in another shard than the one holding it, or in a shard that does not hold it, is
// refused: the index would send a loader to the wrong file. component
// ("" or "transformer/") prefixes file paths in provenance and, as "transformer.", the tensor
// names.
func (s *source) readTensors(dir, component string, read func(string, bool) ([]byte, error)) error {
	var shards []string
	var idx []byte
	for _, name := range []string{"model.safetensors.index.json", "diffusion_pytorch_model.safetensors.index.json"} {
		b, err := read(component+name, false)
		if err != nil {
			return err
		}
		if b != nil {
			idx = b
			break
		}
	}
	var weightMap map[string]string
	if idx != nil {
		var err error
		if weightMap, shards, err = parseSafetensorsIndex(idx); err != nil {
			return fmt.Errorf("bundle: checkpoint %s: %v", dir, err)
		}
	} else {
		m, _ := filepath.Glob(filepath.Join(dir, "*.safetensors"))
		for _, p := range m {
			shards = append(shards, filepath.Base(p))
		}
	}
	if len(shards) == 0 {
		return fmt.Errorf("bundle: checkpoint %s has no *.safetensors files", dir)
	}
	sort.Strings(shards)
	prefix := strings.ReplaceAll(component, "/", ".")
	seen := map[string]bool{}
	for _, t := range s.tensors {
		seen[t.Name] = true
	}
	for _, sh := range shards {
		p := filepath.Join(dir, sh)
		ts, err := readSafetensorsHeader(p)
		if err != nil {
			return err
		}
		s.shards = append(s.shards, shardFile{key: component + sh, path: p})
		for _, t := range ts {
			if f, listed := weightMap[t.Name]; listed && f != sh {
				return fmt.Errorf("bundle: checkpoint %s: shard %s holds tensor %q, which the safetensors index puts in %q; rewrite the index", dir, sh, t.Name, weightMap[t.Name])
			}
			delete(weightMap, t.Name)
			if _, float := stDTypeSize[t.DType]; !float {
				s.skipped = append(s.skipped, fmt.Sprintf("%s%s (%s)", prefix, t.Name, t.DType))
				continue
			}
			if _, err := t.elements(); err != nil {
				return err
			}
			t.Name = prefix + t.Name
			if seen[t.Name] {
				return fmt.Errorf("bundle: checkpoint %s: tensor %q appears twice (shard %s)", dir, t.Name, sh)
			}
			seen[t.Name] = true
			s.tensors = append(s.tensors, t)
		}
	}
	if len(weightMap) > 0 {
		left := make([]string, 0, len(weightMap))
		for name := range weightMap {
			left = append(left, name)
		}
		sort.Strings(left)
		return fmt.Errorf("bundle: checkpoint %s: the safetensors index puts tensor %q in shard %s, which does not hold it (%d such tensors)", dir, left[0], weightMap[left[0]], len(left))
	}
	sort.Slice(s.tensors, func(i, j int) bool { return s.tensors[i].Name < s.tensors[j].Name })
	return nil
}

// shardFile is a checkpoint's safetensors file: its provenance key (its path in the
// checkpoint) and where it is read.
type shardFile struct{ key, path string }

// fileSHA256 hashes a whole file, streamed a MiB at a time, and gives up once ctx is done (a
// build that failed or was cancelled does not go on reading a 10 GB shard).
func fileSHA256(ctx context.Context, path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("bundle: hash checkpoint file %s for provenance: %w", path, err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.CopyBuffer(h, ctxReader{ctx, f}, make([]byte, 1<<20)); err != nil {
		return "", fmt.Errorf("bundle: hash checkpoint file %s for provenance: %w; check that it is readable and that nothing writes it during the build", path, err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// ctxReader reads r until ctx is done.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

func mockSource(o BuildOptions) (*source, error) {
	if o.TokenizerDir == "" {
		return nil, errors.New(`bundle: a mock bundle needs BuildOptions.TokenizerDir (tokenizer.json + tokenizer_config.json); pass the gpt2-tiny fixture snapshot from fixtures.Ensure(cache, "gpt2-tiny")`)
	}
	vocab := o.MockVocab
	if vocab == 0 {
		vocab = DefaultMockVocab
	}
	if vocab < 0 {
		return nil, fmt.Errorf("bundle: mock vocab %d is negative", vocab)
	}
	ctxLen := o.MaxContext
	if ctxLen == 0 {
		ctxLen = MaxDefaultContext
	}
	id := o.Model
	if id == "" {
		id = DefaultMockID
	}
	if !validCheckpointID(id) {
		return nil, fmt.Errorf("bundle: model %q is not of the form ORG/NAME", id)
	}
	s := &source{family: "mock", task: "text", arch: "MockForCausalLM", id: id, maxContext: ctxLen, files: map[string]string{}}
	var err error
	for _, f := range []struct {
		name string
		dst  *[]byte
	}{{"tokenizer.json", &s.tokenizer}, {"tokenizer_config.json", &s.tokCf}} {
		if *f.dst, err = os.ReadFile(filepath.Join(o.TokenizerDir, f.name)); err != nil {
			return nil, fmt.Errorf("bundle: mock tokenizer: %v", err)
		}
		s.files[f.name] = sum(*f.dst)
	}
	s.config, _ = json.MarshalIndent(map[string]any{
		"architectures":           []string{"MockForCausalLM"},
		"model_type":              "mock",
		"vocab_size":              vocab,
		"step_delay_ns":           o.MockStepDelay.Nanoseconds(),
		"max_position_embeddings": ctxLen,
		"eos_token_id":            -1,
	}, "", "  ")
	s.genCfg, _ = json.MarshalIndent(map[string]any{"eos_token_id": -1}, "", "  ")
	// The mock has no upstream commit: its revision is derived from everything it contains,
	// so the same settings and tokenizer always give the same revision.
	h := sha256.New()
	for _, b := range [][]byte{s.config, s.genCfg, s.tokenizer, s.tokCf} {
		h.Write(b)
	}
	s.revision = hex.EncodeToString(h.Sum(nil))[:40]
	return s, nil
}

// builderInfo reports the source revision and dirty state of the code that builds the bundle:
// link-time variables first, then the Go build info's vcs stamp, then git in the working dir.
func builderInfo(ctx context.Context) Builder {
	b := Builder{SourceRevision: "unknown", GoVersion: runtime.Version()}
	if SourceRevision != "" {
		b.SourceRevision, b.Dirty = SourceRevision, SourceDirty == "true"
		return b
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		var rev, mod string
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.modified":
				mod = s.Value
			}
		}
		if rev != "" {
			b.SourceRevision, b.Dirty = rev, mod == "true"
			return b
		}
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if out, err := exec.CommandContext(ctx, "git", "rev-parse", "HEAD").Output(); err == nil {
		b.SourceRevision = strings.TrimSpace(string(out))
		if st, err := exec.CommandContext(ctx, "git", "status", "--porcelain").Output(); err == nil {
			b.Dirty = len(bytes.TrimSpace(st)) > 0
		}
	}
	return b
}

// layoutWriter writes the data span sequentially at increasing absolute offsets, zero-padding
// gaps, and hashes it in the header's chunks (ChunkSize pieces counted from the data start) on
// other cores while it goes on: each chunk is gathered in a buffer, written to the file, then
// handed to a sumPool, and the next chunk is filled meanwhile. A buffer is reused once hashed
// and another is allocated only when none is free; as the pool takes a chunk only when a worker
// is free, at most one buffer per worker plus the one being filled exist (GOMAXPROCS+1 times
// 16 MiB, fewer when hashing keeps up), whatever the bundle's size.
type layoutWriter struct {
	w        io.Writer
	pos, end int64       // the write position and the data span's planned end
	buf      []byte      // the current chunk from its start to pos; its capacity is the chunk's size
	free     chan []byte // hashed buffers, ready for reuse
	hashes   *sumPool    // one job per chunk, in order
}

// newLayoutWriter writes the data span [dataStart, end) to w, which is positioned at dataStart.
func newLayoutWriter(w io.Writer, dataStart, end int64) *layoutWriter {
	p := newSumPool(int((end - dataStart + ChunkSize - 1) / ChunkSize))
	return &layoutWriter{w: w, pos: dataStart, end: end, free: make(chan []byte, p.workers+1), hashes: p}
}

func (l *layoutWriter) Write(p []byte) (int, error) {
	if int64(len(p)) > l.end-l.pos {
		return 0, fmt.Errorf("bundle: internal layout error: %d bytes to write at offset %d, past the data's planned end %d", len(p), l.pos, l.end)
	}
	written := 0
	for len(p) > 0 {
		if l.buf == nil {
			l.buf = l.buffer(min(ChunkSize, l.end-l.pos))
		}
		n := copy(l.buf[len(l.buf):cap(l.buf)], p)
		l.buf = l.buf[:len(l.buf)+n]
		l.pos += int64(n)
		written += n
		p = p[n:]
		if len(l.buf) == cap(l.buf) {
			if err := l.flushChunk(); err != nil {
				return written, err
			}
		}
	}
	return written, nil
}

// buffer returns an empty buffer of capacity size (a chunk's size), a hashed one if any is free.
func (l *layoutWriter) buffer(size int64) []byte {
	select {
	case b := <-l.free:
		if int64(cap(b)) >= size {
			return b[:0:size]
		}
	default:
	}
	return make([]byte, 0, size)
}

// flushChunk writes the complete current chunk and hands it to the pool to hash.
func (l *layoutWriter) flushChunk() error {
	b := l.buf
	l.buf = nil
	if _, err := l.w.Write(b); err != nil {
		return fmt.Errorf("bundle: write the bundle's data: %w", err)
	}
	l.hashes.add(func() (string, error) {
		s := sum(b)
		l.free <- b
		return s, nil
	})
	return nil
}

// finish returns every chunk's sha256, in order, once the last is hashed. The data span must
// have been written to its planned end.
func (l *layoutWriter) finish() ([]string, error) {
	sums, _ := l.hashes.wait() // the jobs cannot fail
	if l.pos != l.end || len(l.buf) != 0 {
		return nil, fmt.Errorf("bundle: internal layout error: wrote the data to offset %d, planned to %d", l.pos, l.end)
	}
	return sums, nil
}

// stop stops the hashing goroutines of a writer that will not finish (a failed build).
func (l *layoutWriter) stop() { l.hashes.wait() }

func (l *layoutWriter) padTo(off int64) error {
	if off < l.pos {
		return fmt.Errorf("bundle: internal layout error: offset %d behind write position %d", off, l.pos)
	}
	for off > l.pos {
		n := min(off-l.pos, int64(len(zeros)))
		if _, err := l.Write(zeros[:n]); err != nil {
			return err
		}
	}
	return nil
}

var zeros = make([]byte, 64<<10)

const zeroSum = "0000000000000000000000000000000000000000000000000000000000000000"

// storedShape folds the trailing dimensions of a tensor with more than four (a Conv3d kernel
// [out, in, kt, kh, kw], as Qwen3-VL's patch embedding) into the fourth, [out, in, kt, kh*kw]:
// the row-major bytes are the same, and the runtime's tensor table holds at most four
// dimensions. The model code asks for the folded shape.
func storedShape(shape []int64) []int64 {
	if len(shape) <= 4 {
		return shape
	}
	out := append([]int64{}, shape[:3]...)
	last := int64(1)
	for _, d := range shape[3:] {
		last *= d
	}
	return append(out, last)
}

// hashShards starts hashing the shard files in the background, as many at once as there are
// cores, and returns a function that waits for their sums, in the order of shards (it may be
// called again). Once ctx is done the hashing stops, and the function still waits until no
// file is being read.
func hashShards(ctx context.Context, shards []shardFile) func() ([]string, error) {
	type result struct {
		sums []string
		err  error
	}
	done := make(chan result, 1)
	go func() {
		p := newSumPool(len(shards))
		for _, sh := range shards {
			p.add(func() (string, error) { return fileSHA256(ctx, sh.path) })
		}
		sums, err := p.wait()
		done <- result{sums, err}
	}()
	return sync.OnceValues(func() ([]string, error) {
		r := <-done
		return r.sums, r.err
	})
}

func write(ctx context.Context, o BuildOptions, s *source) (*Header, error) {
	// The shards' sha256s, for provenance, are computed while the bundle is written rather than
	// before: each is one sequential pass over a file of up to ~10 GB, as long as a good part of
	// the write pass, which reads the same files. A build that fails stops them.
	ctx, cancel := context.WithCancel(ctx)
	shardSums := hashShards(ctx, s.shards)
	defer func() {
		cancel()
		shardSums()
	}()
	files := maps.Clone(s.files)
	for _, sh := range s.shards {
		files[sh.key] = zeroSum // a placeholder of the sum's length, so the header's length holds
	}
	dtype := storageDType[o.Precision]
	h := &Header{
		FormatVersion:    FormatVersion,
		Family:           s.family,
		Task:             s.task,
		Architecture:     s.arch,
		Config:           compactJSON(s.config),
		GenerationConfig: compactJSON(s.genCfg),
		Tensors:          make([]TensorInfo, len(s.tensors)),
		Provenance: Provenance{
			CheckpointID:   s.id,
			Revision:       s.revision,
			Files:          files,
			SkippedTensors: s.skipped,
			RenamedTensors: s.renamed,
			Build: BuildSettings{
				Precision:     o.Precision,
				MaxContext:    s.maxContext,
				MaxBatch:      o.MaxBatch,
				Backend:       o.Backend,
				MockStepDelay: o.MockStepDelay.String(),
				StorageDType:  dtype,
			},
			Builder: builderInfo(ctx),
			BuiltAt: time.Now().UTC().Format(time.RFC3339),
		},
		name: o.Out,
	}
	names := append([]string{}, RequiredSections...)
	sections := [][]byte{s.tokenizer, s.tokCf, s.genCfg, s.config} // RequiredSections order
	for _, n := range OptionalSections {
		if b, ok := s.optional[n]; ok {
			names = append(names, n)
			sections = append(sections, b)
		}
	}
	for i := range s.tensors {
		t := s.tensors[i]
		n, _ := t.elements()
		h.Tensors[i] = TensorInfo{Name: t.Name, DType: dtype, Shape: storedShape(t.Shape), Size: n * dtypeSize[dtype]}
	}
	// The header holds the offsets, the offsets depend on the header's length: iterate to a
	// fixed point (sha256 placeholders have their final length, so filling them in later
	// keeps the length).
	layout := func(dataStart int64) {
		off := dataStart
		h.Sections = h.Sections[:0]
		for i, b := range sections {
			h.Sections = append(h.Sections, Section{Name: names[i], Offset: off, Size: int64(len(b)), SHA256: zeroSum})
			off = align(off + int64(len(b)))
		}
		// With no tensors (the mock) the file ends padded to the empty tensor region's start.
		h.TensorData = Region{Offset: off}
		end := off
		for i := range h.Tensors {
			h.Tensors[i].Offset = off
			end = off + h.Tensors[i].Size
			off = align(end)
		}
		if n := len(h.Tensors); n > 0 {
			h.TensorData.Size = h.Tensors[n-1].Offset + h.Tensors[n-1].Size - h.TensorData.Offset
		}
		h.Data = Data{Offset: dataStart, Size: end - dataStart, ChunkSize: ChunkSize}
		h.Data.Chunks = make([]string, (h.Data.Size+ChunkSize-1)/ChunkSize)
		for i := range h.Data.Chunks {
			h.Data.Chunks[i] = zeroSum
		}
	}
	var hdr []byte
	dataStart := int64(0)
	for {
		layout(dataStart)
		var err error
		if hdr, err = json.Marshal(h); err != nil {
			return nil, fmt.Errorf("bundle: encode header: %w", err)
		}
		need := align(prefixSize + int64(len(hdr)))
		if need <= dataStart {
			break
		}
		dataStart = need
	}
	hdrLen := len(hdr)

	if err := os.MkdirAll(filepath.Dir(o.Out), 0o755); err != nil {
		return nil, fmt.Errorf("bundle: create output dir: %w", err)
	}
	// A unique temporary name: concurrent builders of the same output (parallel test
	// processes) each write their own file, and the last rename wins with a complete bundle.
	f, err := os.CreateTemp(filepath.Dir(o.Out), filepath.Base(o.Out)+".tmp-*")
	if err != nil {
		return nil, fmt.Errorf("bundle: create a temporary file next to %s: %w", o.Out, err)
	}
	tmp := f.Name()
	ok := false
	defer func() {
		if !ok {
			f.Close()
			os.Remove(tmp)
		}
	}()
	if err := f.Chmod(0o644); err != nil {
		return nil, fmt.Errorf("bundle: chmod %s: %w", tmp, err)
	}
	if _, err := f.Seek(dataStart, io.SeekStart); err != nil {
		return nil, fmt.Errorf("bundle: write %s: %w", tmp, err)
	}
	lw := newLayoutWriter(f, dataStart, h.Data.Offset+h.Data.Size)
	defer lw.stop()
	for i, b := range sections {
		if err := lw.padTo(h.Sections[i].Offset); err != nil {
			return nil, err
		}
		if _, err := lw.Write(b); err != nil {
			return nil, fmt.Errorf("bundle: write %s: %w", tmp, err)
		}
		h.Sections[i].SHA256 = sum(b)
	}
	readers := map[string]*os.File{}
	defer func() {
		for _, r := range readers {
			r.Close()
		}
	}()
	for i, t := range s.tensors {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("bundle: build cancelled: %w", err)
		}
		if err := lw.padTo(h.Tensors[i].Offset); err != nil {
			return nil, err
		}
		r := readers[t.File]
		if r == nil {
			if r, err = os.Open(t.File); err != nil {
				return nil, fmt.Errorf("bundle: %w", err)
			}
			readers[t.File] = r
		}
		if err := copyAs(lw, r, t, dtype); err != nil {
			return nil, err
		}
	}
	if err := lw.padTo(h.Data.Offset + h.Data.Size); err != nil {
		return nil, err
	}
	chunks, err := lw.finish()
	if err != nil {
		return nil, err
	}
	if len(chunks) != len(h.Data.Chunks) {
		return nil, fmt.Errorf("bundle: internal layout error: wrote %d bytes in %d chunks, planned %d in %d", lw.pos-dataStart, len(chunks), h.Data.Size, len(h.Data.Chunks))
	}
	copy(h.Data.Chunks, chunks)
	sums, err := shardSums()
	if err != nil {
		return nil, err
	}
	for i, sh := range s.shards {
		files[sh.key] = sums[i]
	}
	if hdr, err = json.Marshal(h); err != nil || len(hdr) != hdrLen {
		return nil, fmt.Errorf("bundle: internal error: header length changed from %d to %d after hashing", hdrLen, len(hdr))
	}
	prefix := make([]byte, prefixSize, prefixSize+len(hdr))
	copy(prefix, Magic)
	binary.LittleEndian.PutUint32(prefix[8:], FormatVersion)
	binary.LittleEndian.PutUint64(prefix[16:], uint64(len(hdr)))
	hs := sha256.Sum256(hdr)
	copy(prefix[24:], hs[:])
	// The gap between the header and the data start is zero padding.
	if _, err := f.WriteAt(append(prefix, hdr...), 0); err != nil {
		return nil, fmt.Errorf("bundle: write header of %s: %w", tmp, err)
	}
	// A bundle with no tensors (mock) must still reach its last section's end.
	if err := f.Truncate(lw.pos); err != nil {
		return nil, fmt.Errorf("bundle: write %s: %w", tmp, err)
	}
	if err := f.Close(); err != nil {
		return nil, fmt.Errorf("bundle: close %s: %w", tmp, err)
	}
	if err := os.Rename(tmp, o.Out); err != nil {
		return nil, fmt.Errorf("bundle: rename %s to %s: %w", tmp, o.Out, err)
	}
	ok = true
	ds := sha256.Sum256(prefix)
	h.digest = hex.EncodeToString(ds[:])
	return h, nil
}

func compactJSON(b []byte) json.RawMessage {
	var buf bytes.Buffer
	if err := json.Compact(&buf, b); err != nil {
		return json.RawMessage(b)
	}
	return buf.Bytes()
}
