// Package bundle is the one-file container the native runtime serves from: a JSON header
// (family, task, tensor table, sections, provenance) followed by 64-byte aligned tensor data
// that the runtime maps read-only with mmap, plus the tokenizer and config files.
//
// Why one file: a qualification names exactly one artifact; its digest identifies what was
// served, and its provenance says which checkpoint revision and build settings produced it.
//
// File layout, format version 2 (all integers little-endian, all offsets absolute from the file
// start):
//
//	magic "MQBUNDLE" (8 bytes) | uint32 format version (2) | uint32 reserved (0)
//	uint64 header JSON length | sha256 of the header JSON (32 bytes)
//	header JSON | zero padding to 64
//	data: sections and tensors, each starting at a multiple of 64, to the end of the file
//
// Integrity: the data (everything after the header, padding included) is hashed in chunks of
// header.data.chunk_size bytes, each chunk's sha256 listed in the header; the header's own
// sha256 sits in the fixed prefix. So every byte of the file is covered by a SHA-256 that leads
// up to the prefix, and the bundle's Digest (the sha256 of the prefix) identifies the whole
// file as a whole-file sha256 would, while verification hashes the chunks in parallel.
//
// Tensors keep their checkpoint names, or, where the family's layout says another layout names
// them otherwise (a missing base-model prefix, a causal LM saved as a text encoder), the names
// the family reads (a pipeline's are prefixed with their component:
// "transformer.layers.0.attention.to_q.weight"); they are stored at the build precision: F32,
// BF16 or F16. The CPU runtime converts what it needs at load; the CUDA backend uploads
// tensors of its precision as they are. The bundle knows no family: the caller of Build says
// which runtime family serves the checkpoint's architecture (Resolver).
package bundle

import (
	"encoding/json"
	"time"
)

// Magic starts every bundle file.
const Magic = "MQBUNDLE"

// FormatVersion is the only version this package reads and writes. Version 1 (every tensor
// F32, one sha256 per section and over all tensor data, no header checksum) is refused with a
// message saying how to rebuild.
const FormatVersion = 2

// Alignment of every section and tensor, so the runtime can use the mapping directly
// (64 bytes = one cache line and an AVX-512 vector).
const Alignment = 64

// ChunkSize is the span each data chunk hash covers: small enough that a many-core machine
// hashes a bundle in parallel and a 32 GB bundle's list stays about 130 KB of header, large
// enough that the list of a small bundle is a few entries.
const ChunkSize = 16 << 20

// prefixSize is magic + version + reserved + header length + header sha256.
const prefixSize = 8 + 4 + 4 + 8 + 32

// maxHeaderLen bounds the JSON header so a corrupt length cannot make the reader allocate
// gigabytes; real headers are a few hundred kilobytes at most.
const maxHeaderLen = 64 << 20

// Section names every bundle carries.
const (
	SectionTokenizer        = "tokenizer.json"
	SectionTokenizerConfig  = "tokenizer_config.json"
	SectionGenerationConfig = "generation_config.json"
	SectionConfig           = "config.json"
	// SectionPreprocessorConfig is a vision-language checkpoint's image processor settings.
	SectionPreprocessorConfig = "preprocessor_config.json"
	// SectionChatTemplate is a checkpoint's chat template kept beside the tokenizer config
	// (transformers 4.43+ writes chat_template.jinja, older ones chat_template.json).
	SectionChatTemplate     = "chat_template.jinja"
	SectionChatTemplateJSON = "chat_template.json"
	// SectionVocab and SectionMerges are a BPE tokenizer kept as vocab.json and merges.txt
	// without tokenizer.json (CLIP's, as FLUX.1's tokenizer/ ships it); the tokenizer.json
	// section is then empty and readers build the tokenizer from these (server/tokenizer
	// FromBundle).
	SectionVocab  = "vocab.json"
	SectionMerges = "merges.txt"
	// SectionTokenizer2 and SectionTokenizer2Config are a pipeline's second tokenizer
	// (tokenizer_2/: FLUX.1's T5), for its second text encoder.
	SectionTokenizer2       = "tokenizer_2/tokenizer.json"
	SectionTokenizer2Config = "tokenizer_2/tokenizer_config.json"
)

// RequiredSections lists the sections every bundle must carry, in file order.
var RequiredSections = []string{SectionTokenizer, SectionTokenizerConfig, SectionGenerationConfig, SectionConfig}

// OptionalSections are carried when the checkpoint has them, after the required ones.
var OptionalSections = []string{SectionPreprocessorConfig, SectionChatTemplate, SectionChatTemplateJSON, SectionVocab, SectionMerges,
	SectionTokenizer2, SectionTokenizer2Config}

// Tasks a bundle may serve.
var Tasks = []string{"text", "image", "vision"}

// Header is the JSON header of a bundle. Config and GenerationConfig are the checkpoint's
// config.json and generation_config.json verbatim; a diffusers pipeline's Config is one object
// holding model_index.json and each component's config under the component's name.
type Header struct {
	FormatVersion    int             `json:"format_version"`
	Family           string          `json:"family"` // the runtime family, e.g. "qwen3"
	Task             string          `json:"task"`   // "text" | "image" | "vision"
	Architecture     string          `json:"architecture"`
	Config           json.RawMessage `json:"config"`
	GenerationConfig json.RawMessage `json:"generation_config"`
	Tensors          []TensorInfo    `json:"tensors"`
	Sections         []Section       `json:"sections"`
	TensorData       Region          `json:"tensor_data"`
	Data             Data            `json:"data"`
	Provenance       Provenance      `json:"provenance"`

	name   string // file name used in error messages; not serialised
	digest string // sha256 of the file's prefix (Bundle.Digest); not serialised
}

// TensorInfo is one entry of the tensor table.
type TensorInfo struct {
	Name   string  `json:"name"`
	DType  string  `json:"dtype"` // "F32" | "BF16" | "F16"
	Shape  []int64 `json:"shape"`
	Offset int64   `json:"offset"`
	Size   int64   `json:"size"`
}

// Section is a file carried verbatim inside the bundle. Its sha256 is the file's, so a
// provenance record can name the tokenizer a bundle carries.
type Section struct {
	Name   string `json:"name"`
	Offset int64  `json:"offset"`
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"`
}

// Region is the span holding all tensors (with their alignment padding).
type Region struct {
	Offset int64 `json:"offset"`
	Size   int64 `json:"size"`
}

// Data is the span from the end of the header to the end of the file and the sha256 of each
// of its ChunkSize chunks, in order (the last may be shorter).
type Data struct {
	Offset    int64    `json:"offset"`
	Size      int64    `json:"size"`
	ChunkSize int64    `json:"chunk_size"`
	Chunks    []string `json:"chunk_sha256"`
}

// Provenance says where the bundle came from and how it was built.
type Provenance struct {
	CheckpointID string            `json:"checkpoint_id"` // ORG/NAME
	Revision     string            `json:"revision"`      // 40-hex immutable commit
	Files        map[string]string `json:"files"`         // checkpoint file path -> sha256
	// SkippedTensors are the checkpoint's tensors left out: non-float ones (integer or boolean
	// buffers such as causal masks and position ids, "name (DTYPE)"), which are not weights,
	// and those the family's layout drops as the reference loader discards them (a tied head).
	SkippedTensors []string `json:"skipped_tensors,omitempty"`
	// RenamedTensors are the family layout's renames applied to the checkpoint's tensor names,
	// as `"from" -> "to" (N tensors)`: the bundle's names are the ones the family reads.
	RenamedTensors []string      `json:"renamed_tensors,omitempty"`
	Build          BuildSettings `json:"build"`
	Builder        Builder       `json:"builder"`
	BuiltAt        string        `json:"built_at"` // RFC3339
}

// BuildSettings are the resolved build options.
type BuildSettings struct {
	Precision     string `json:"precision"` // fp32 | bf16 | fp16: the stored and (cuda) computed precision
	MaxContext    int    `json:"max_context"`
	MaxBatch      int    `json:"max_batch"`
	Backend       string `json:"backend"` // cpu | cuda
	MockStepDelay string `json:"mock_step_delay"`
	// StorageDType is the dtype of the stored tensors: F32, BF16 or F16.
	StorageDType string `json:"storage_dtype"`
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

// storageDType is the stored dtype of each build precision.
var storageDType = map[string]string{"fp32": "F32", "bf16": "BF16", "fp16": "F16"}
