// Package bundle is the one-file container the native runtime serves from: a JSON header
// (family, tensor table, sections with sha256, provenance) followed by 64-byte aligned tensor
// data that the runtime maps read-only with mmap, plus the tokenizer and config files.
//
// Why one file: a qualification names exactly one artifact; its sha256 identifies what was
// served, and its provenance says which checkpoint revision and build settings produced it.
//
// File layout (all integers little-endian, all offsets absolute from the file start):
//
//	magic "MQBUNDLE" (8 bytes) | uint32 format version (1) | uint32 reserved (0)
//	uint64 header JSON length | header JSON | zero padding to 64
//	sections and tensor data, each starting at a multiple of 64
//
// Tensor names are the Hugging Face names of the family, normalised:
//
//	gpt2:  wte.weight, wpe.weight, h.N.ln_1.weight, h.N.attn.c_attn.weight (Conv1D [in,out]),
//	       ..., ln_f.weight ("transformer." prefixes are stripped; attn.bias buffers dropped)
//	qwen3: model.embed_tokens.weight, model.layers.N.self_attn.q_proj.weight ([out,in]), ...,
//	       model.norm.weight, lm_head.weight (only when tie_word_embeddings is false or present)
//
// All tensors are stored as F32 whatever the build precision; a bf16/fp16 precision is a
// request to the cuda backend to convert at load time (see Build.StorageNote).
package bundle

import (
	"encoding/json"
	"time"
)

// Magic starts every bundle file.
const Magic = "MQBUNDLE"

// FormatVersion is the only version this package reads and writes.
const FormatVersion = 1

// Alignment of every section and tensor, so the runtime can use the mapping directly
// (64 bytes = one cache line and an AVX-512 vector).
const Alignment = 64

// prefixSize is magic + version + reserved + header length.
const prefixSize = 8 + 4 + 4 + 8

// maxHeaderLen bounds the JSON header so a corrupt length cannot make the reader allocate
// gigabytes; real headers are a few hundred kilobytes at most.
const maxHeaderLen = 64 << 20

// Section names every bundle carries.
const (
	SectionTokenizer        = "tokenizer.json"
	SectionTokenizerConfig  = "tokenizer_config.json"
	SectionGenerationConfig = "generation_config.json"
	SectionConfig           = "config.json"
)

// RequiredSections lists the sections every bundle must carry, in file order.
var RequiredSections = []string{SectionTokenizer, SectionTokenizerConfig, SectionGenerationConfig, SectionConfig}

// Header is the JSON header of a bundle. Config and GenerationConfig are the checkpoint's
// config.json and generation_config.json verbatim.
type Header struct {
	FormatVersion    int             `json:"format_version"`
	Family           string          `json:"family"` // "gpt2", "qwen3", "mock"
	Task             string          `json:"task"`   // "text"
	Architecture     string          `json:"architecture"`
	Config           json.RawMessage `json:"config"`
	GenerationConfig json.RawMessage `json:"generation_config"`
	Tensors          []TensorInfo    `json:"tensors"`
	Sections         []Section       `json:"sections"`
	TensorData       Region          `json:"tensor_data"`
	Provenance       Provenance      `json:"provenance"`

	name string // file name used in error messages; not serialised
}

// TensorInfo is one entry of the tensor table.
type TensorInfo struct {
	Name   string  `json:"name"`
	DType  string  `json:"dtype"` // "F32"
	Shape  []int64 `json:"shape"`
	Offset int64   `json:"offset"`
	Size   int64   `json:"size"`
}

// Section is a file carried verbatim inside the bundle.
type Section struct {
	Name   string `json:"name"`
	Offset int64  `json:"offset"`
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"`
}

// Region is the span holding all tensors (with their alignment padding), hashed as one.
type Region struct {
	Offset int64  `json:"offset"`
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"`
}

// Provenance says where the bundle came from and how it was built.
type Provenance struct {
	CheckpointID string            `json:"checkpoint_id"` // ORG/NAME
	Revision     string            `json:"revision"`      // 40-hex immutable commit
	Files        map[string]string `json:"files"`         // checkpoint file name -> sha256
	Build        BuildSettings     `json:"build"`
	Builder      Builder           `json:"builder"`
	BuiltAt      string            `json:"built_at"` // RFC3339
}

// BuildSettings are the resolved build options.
type BuildSettings struct {
	Precision     string `json:"precision"` // fp32 | bf16 | fp16
	MaxContext    int    `json:"max_context"`
	MaxBatch      int    `json:"max_batch"`
	Backend       string `json:"backend"` // cpu | cuda
	MockStepDelay string `json:"mock_step_delay"`
	// StorageDType is the dtype of the stored tensors (always F32 in format version 1).
	StorageDType string `json:"storage_dtype,omitempty"`
	// StorageNote explains a precision that differs from the storage dtype.
	StorageNote string `json:"storage_note,omitempty"`
}

// Builder identifies the code that built the bundle.
type Builder struct {
	SourceRevision string `json:"source_revision"` // git sha or "unknown"
	Dirty          bool   `json:"dirty"`
	GoVersion      string `json:"go_version"`
}

// MockStepDelay parses Provenance.Build.MockStepDelay (zero when empty).
func (h *Header) MockStepDelay() (time.Duration, error) {
	if h.Provenance.Build.MockStepDelay == "" {
		return 0, nil
	}
	return time.ParseDuration(h.Provenance.Build.MockStepDelay)
}

// Name is the file name the header was read from (used in error messages).
func (h *Header) Name() string { return h.name }

// Tensor finds a tensor in the table.
func (h *Header) Tensor(name string) (TensorInfo, bool) {
	for _, t := range h.Tensors {
		if t.Name == name {
			return t, true
		}
	}
	return TensorInfo{}, false
}

// dtypeSize is the byte size of one element of each storable dtype.
var dtypeSize = map[string]int64{"F32": 4, "F16": 2, "BF16": 2}

// knownArchitectures maps a config.json architecture to its native family.
var knownArchitectures = map[string]string{
	"GPT2LMHeadModel":  "gpt2",
	"Qwen3ForCausalLM": "qwen3",
	"MockForCausalLM":  "mock",
}
