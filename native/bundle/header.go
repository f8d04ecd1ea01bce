package bundle

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"regexp"
	"sort"
	"time"
)

// rebuildHint ends every structural error: a malformed bundle is never repaired in place.
const rebuildHint = "rebuild the bundle with qual bundle build"

var (
	hex40 = regexp.MustCompile(`^[0-9a-f]{40}$`)
	hex64 = regexp.MustCompile(`^[0-9a-f]{64}$`)
)

// FormatError is a structural or integrity problem of a bundle file. Field is the header path
// of the offending value (e.g. "header.sections[1].offset").
type FormatError struct {
	File   string
	Field  string
	Detail string
}

func (e *FormatError) Error() string {
	return fmt.Sprintf("bundle %s: %s %s; %s", e.File, e.Field, e.Detail, rebuildHint)
}

func ferr(file, field, format string, args ...any) error {
	return &FormatError{File: file, Field: field, Detail: fmt.Sprintf(format, args...)}
}

// ReadHeader reads and structurally validates the header of a bundle of the given size:
// magic, version, header length, JSON, every offset/size/alignment/overlap, tensor sizes
// against shapes, the family's required tensors and shapes, the architecture and the
// provenance fields. It does not hash data (Open does). It never panics on any input (it is
// fuzzed: FuzzReadHeader) and every error names the file and the field.
func ReadHeader(r io.ReaderAt, size int64, name string) (*Header, error) {
	if size < prefixSize {
		return nil, ferr(name, "file", "is truncated: %d bytes, shorter than the %d-byte prefix", size, prefixSize)
	}
	var pre [prefixSize]byte
	if _, err := r.ReadAt(pre[:], 0); err != nil {
		return nil, ferr(name, "file", "cannot be read: %v", err)
	}
	if string(pre[:8]) != Magic {
		return nil, ferr(name, "magic", "is %q, want %q (not a modelqual bundle)", pre[:8], Magic)
	}
	if v := binary.LittleEndian.Uint32(pre[8:12]); v != FormatVersion {
		return nil, ferr(name, "format_version", "%d is not supported (this build reads version %d)", v, FormatVersion)
	}
	if v := binary.LittleEndian.Uint32(pre[12:16]); v != 0 {
		return nil, ferr(name, "reserved", "is %d, want 0", v)
	}
	hlen := binary.LittleEndian.Uint64(pre[16:24])
	if hlen == 0 || hlen > uint64(size-prefixSize) {
		return nil, ferr(name, "header_length", "%d runs past end of file (size %d)", hlen, size)
	}
	if hlen > maxHeaderLen {
		return nil, ferr(name, "header_length", "%d exceeds the %d-byte limit", hlen, maxHeaderLen)
	}
	buf := make([]byte, hlen)
	if _, err := r.ReadAt(buf, prefixSize); err != nil {
		return nil, ferr(name, "header", "cannot be read: %v", err)
	}
	h := &Header{}
	dec := json.NewDecoder(bytes.NewReader(buf))
	if err := dec.Decode(h); err != nil {
		return nil, ferr(name, "header", "is not valid JSON: %v", err)
	}
	if dec.More() {
		return nil, ferr(name, "header", "has trailing data after the JSON object")
	}
	h.name = name
	dataStart := align(prefixSize + int64(hlen))
	if err := h.validate(size, dataStart); err != nil {
		return nil, err
	}
	return h, nil
}

// validate checks everything that can be checked without reading data.
func (h *Header) validate(size, dataStart int64) error {
	n := h.name
	if h.FormatVersion != FormatVersion {
		return ferr(n, "header.format_version", "%d does not match the file's version %d", h.FormatVersion, FormatVersion)
	}
	if h.Task != "text" {
		return ferr(n, "header.task", "%q is not supported (want \"text\")", h.Task)
	}
	fam, ok := knownArchitectures[h.Architecture]
	if !ok {
		return ferr(n, "header.architecture", "%q is not known (known: %s, MockForCausalLM)", h.Architecture, knownArchitectureList())
	}
	if fam != h.Family {
		return ferr(n, "header.family", "%q does not match architecture %s (family %s)", h.Family, h.Architecture, fam)
	}
	if !isObject(h.Config) {
		return ferr(n, "header.config", "is not a JSON object")
	}
	if !isObject(h.GenerationConfig) {
		return ferr(n, "header.generation_config", "is not a JSON object")
	}

	// Spans: every section, the tensor region, each tensor. Check bounds and alignment, then
	// overlaps between sections and the tensor region, and between tensors.
	type span struct {
		field    string
		off, end int64
	}
	checkSpan := func(field string, off, sz int64) (span, error) {
		if off < dataStart {
			return span{}, ferr(n, field+".offset", "%d lies inside the header (data starts at %d)", off, dataStart)
		}
		if off%Alignment != 0 {
			return span{}, ferr(n, field+".offset", "%d is not %d-byte aligned", off, Alignment)
		}
		if sz < 0 {
			return span{}, ferr(n, field+".size", "%d is negative", sz)
		}
		if off > size || sz > size-off {
			return span{}, ferr(n, field+".offset", "%d past end of file (size %d, span size %d)", off, size, sz)
		}
		return span{field, off, off + sz}, nil
	}
	var outer []span
	seen := map[string]bool{}
	for i, s := range h.Sections {
		f := fmt.Sprintf("header.sections[%d]", i)
		if seen[s.Name] {
			return ferr(n, f+".name", "%q appears twice", s.Name)
		}
		seen[s.Name] = true
		if !isRequiredSection(s.Name) {
			return ferr(n, f+".name", "%q is not a known section (known: %v)", s.Name, RequiredSections)
		}
		if !hex64.MatchString(s.SHA256) {
			return ferr(n, f+".sha256", "%q is not 64 lowercase hex digits", s.SHA256)
		}
		sp, err := checkSpan(f, s.Offset, s.Size)
		if err != nil {
			return err
		}
		outer = append(outer, sp)
	}
	for _, want := range RequiredSections {
		if !seen[want] {
			return ferr(n, "header.sections", "lacks the %q section", want)
		}
	}
	if !hex64.MatchString(h.TensorData.SHA256) {
		return ferr(n, "header.tensor_data.sha256", "%q is not 64 lowercase hex digits", h.TensorData.SHA256)
	}
	region, err := checkSpan("header.tensor_data", h.TensorData.Offset, h.TensorData.Size)
	if err != nil {
		return err
	}
	outer = append(outer, region)
	if err := noOverlap(n, outer, func(s span) (string, int64, int64) { return s.field, s.off, s.end }); err != nil {
		return err
	}

	var inner []span
	shapes := map[string][]int64{}
	for i, t := range h.Tensors {
		f := fmt.Sprintf("header.tensors[%d]", i)
		if t.Name == "" {
			return ferr(n, f+".name", "is empty")
		}
		if _, dup := shapes[t.Name]; dup {
			return ferr(n, f+".name", "%q appears twice", t.Name)
		}
		es, ok := dtypeSize[t.DType]
		if !ok || t.DType != "F32" {
			return ferr(n, f+".dtype", "%q is not supported (tensor %q; format version 1 stores F32)", t.DType, t.Name)
		}
		if len(t.Shape) == 0 || len(t.Shape) > 4 {
			return ferr(n, f+".shape", "%v of tensor %q must have 1 to 4 dimensions", t.Shape, t.Name)
		}
		want := es
		for _, d := range t.Shape {
			if d <= 0 || want > math.MaxInt64/d {
				return ferr(n, f+".shape", "%v of tensor %q has a non-positive or overflowing dimension", t.Shape, t.Name)
			}
			want *= d
		}
		if t.Size != want {
			return ferr(n, f+".size", "%d of tensor %q != shape %v × %d bytes = %d", t.Size, t.Name, t.Shape, es, want)
		}
		sp, err := checkSpan(f, t.Offset, t.Size)
		if err != nil {
			return err
		}
		if sp.off < region.off || sp.end > region.end {
			return ferr(n, f+".offset", "%d (size %d) of tensor %q lies outside header.tensor_data [%d, %d)", t.Offset, t.Size, t.Name, region.off, region.end)
		}
		inner = append(inner, span{f, sp.off, sp.end})
		shapes[t.Name] = t.Shape
	}
	if err := noOverlap(n, inner, func(s span) (string, int64, int64) { return s.field, s.off, s.end }); err != nil {
		return err
	}
	if err := checkTensorSet(h.Family, h.Config, shapes); err != nil {
		return ferr(n, "header.tensors", "do not fit header.config: %v", err)
	}
	return h.validateProvenance()
}

func (h *Header) validateProvenance() error {
	n, p := h.name, h.Provenance
	if !validCheckpointID(p.CheckpointID) {
		return ferr(n, "provenance.checkpoint_id", "%q is not of the form ORG/NAME", p.CheckpointID)
	}
	if !hex40.MatchString(p.Revision) {
		return ferr(n, "provenance.revision", "%q is not an immutable 40-hex commit", p.Revision)
	}
	for file, sum := range p.Files {
		if !hex64.MatchString(sum) {
			return ferr(n, "provenance.files["+file+"]", "%q is not a sha256", sum)
		}
	}
	b := p.Build
	if err := checkPrecisionBackend(b.Precision, b.Backend); err != nil {
		return ferr(n, "provenance.build", "%v", err)
	}
	if b.MaxContext <= 0 {
		return ferr(n, "provenance.build.max_context", "%d must be positive", b.MaxContext)
	}
	if b.MaxBatch <= 0 {
		return ferr(n, "provenance.build.max_batch", "%d must be positive", b.MaxBatch)
	}
	if d, err := time.ParseDuration(b.MockStepDelay); err != nil || d < 0 {
		return ferr(n, "provenance.build.mock_step_delay", "%q is not a non-negative duration", b.MockStepDelay)
	}
	if _, err := time.Parse(time.RFC3339, p.BuiltAt); err != nil {
		return ferr(n, "provenance.built_at", "%q is not RFC3339", p.BuiltAt)
	}
	return nil
}

// noOverlap sorts spans by offset and reports the first pair that overlaps.
func noOverlap[S any](file string, spans []S, get func(S) (string, int64, int64)) error {
	sorted := append([]S(nil), spans...)
	sort.Slice(sorted, func(i, j int) bool {
		_, a, _ := get(sorted[i])
		_, b, _ := get(sorted[j])
		return a < b
	})
	for i := 1; i < len(sorted); i++ {
		pf, _, pend := get(sorted[i-1])
		f, off, _ := get(sorted[i])
		if off < pend {
			return ferr(file, f+".offset", "%d overlaps %s (which ends at %d)", off, pf, pend)
		}
	}
	return nil
}

func isRequiredSection(name string) bool {
	for _, s := range RequiredSections {
		if s == name {
			return true
		}
	}
	return false
}

func isObject(raw json.RawMessage) bool {
	var m map[string]json.RawMessage
	return json.Unmarshal(raw, &m) == nil && m != nil
}

func validCheckpointID(id string) bool {
	org, name, ok := bytes.Cut([]byte(id), []byte("/"))
	return ok && len(org) > 0 && len(name) > 0 && !bytes.Contains(name, []byte("/"))
}

func checkPrecisionBackend(precision, backend string) error {
	switch backend {
	case "cpu":
		if precision != "fp32" {
			return fmt.Errorf("precision %q is not supported by backend cpu (the CPU runtime is fp32); use --precision fp32 or --backend cuda", precision)
		}
	case "cuda":
		if precision != "fp32" && precision != "bf16" && precision != "fp16" {
			return fmt.Errorf("precision %q is not one of fp32, bf16, fp16", precision)
		}
	default:
		return fmt.Errorf("backend %q is not one of cpu, cuda", backend)
	}
	return nil
}

func align(n int64) int64 { return (n + Alignment - 1) / Alignment * Alignment }
