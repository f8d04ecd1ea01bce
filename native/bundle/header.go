package bundle

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"regexp"
	"slices"
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
	Hint   string // what to do; rebuildHint when empty
}

func (e *FormatError) Error() string {
	hint := e.Hint
	if hint == "" {
		hint = rebuildHint
	}
	return fmt.Sprintf("bundle %s: %s %s; %s", e.File, e.Field, e.Detail, hint)
}

func ferr(file, field, format string, args ...any) error {
	return &FormatError{File: file, Field: field, Detail: fmt.Sprintf(format, args...)}
}

// ReadHeader reads and structurally validates the header of a bundle of the given size:
// magic, version, header length and checksum, JSON, every offset/size/alignment/overlap,
// tensor sizes against shapes and dtypes, the chunk list against the data span, and the
// provenance fields. Whether the tensors fit the family is the runtime's check (the family's
// model reads them at open). It does not hash data (Open does). It never panics on any input
// (it is fuzzed: FuzzReadHeader) and every error names the file and the field.
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
		if v == 1 {
			return nil, &FormatError{File: name, Field: "format_version", Detail: "1 is no longer read: version 2 stores tensors at the build precision and hashes the data in chunks",
				Hint: "rebuild it from its checkpoint with `qual bundle build` (the provenance in `qual bundle inspect` of a version-1 build names the checkpoint and settings)"}
		}
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
	if got := sha256.Sum256(buf); !bytes.Equal(got[:], pre[24:56]) {
		return nil, ferr(name, "header_sha256", "mismatch: the prefix says %x, the header hashes to %x (the header was edited or corrupted)", pre[24:56], got)
	}
	dataStart := align(prefixSize + int64(hlen))
	if pad := dataStart - prefixSize - int64(hlen); pad > 0 && dataStart <= size {
		p := make([]byte, pad)
		if _, err := r.ReadAt(p, prefixSize+int64(hlen)); err != nil || !bytes.Equal(p, make([]byte, pad)) {
			return nil, ferr(name, "header padding", "is not %d zero bytes", pad)
		}
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
	ds := sha256.Sum256(pre[:])
	h.digest = hex.EncodeToString(ds[:])
	if err := h.validate(size, dataStart); err != nil {
		return nil, err
	}
	return h, nil
}

// familyName is what a runtime family's name may look like.
var familyName = regexp.MustCompile(`^[a-z][a-z0-9_]*$`)

// validate checks everything that can be checked without reading data.
func (h *Header) validate(size, dataStart int64) error {
	n := h.name
	if h.FormatVersion != FormatVersion {
		return ferr(n, "header.format_version", "%d does not match the file's version %d", h.FormatVersion, FormatVersion)
	}
	if !slices.Contains(Tasks, h.Task) {
		return ferr(n, "header.task", "%q is not one of %v", h.Task, Tasks)
	}
	if !familyName.MatchString(h.Family) {
		return ferr(n, "header.family", "%q is not a family name (lowercase letters, digits, '_')", h.Family)
	}
	if h.Architecture == "" {
		return ferr(n, "header.architecture", "is empty")
	}
	if !isObject(h.Config) {
		return ferr(n, "header.config", "is not a JSON object")
	}
	if !isObject(h.GenerationConfig) {
		return ferr(n, "header.generation_config", "is not a JSON object")
	}

	// The data span runs from the end of the header to the end of the file, and its chunk
	// list covers it exactly.
	d := h.Data
	if d.Offset != dataStart {
		return ferr(n, "header.data.offset", "%d, want %d (the end of the header, aligned)", d.Offset, dataStart)
	}
	if d.Size != size-dataStart {
		return ferr(n, "header.data.size", "%d, want %d (to the end of the file; truncated or extended?)", d.Size, size-dataStart)
	}
	if d.ChunkSize <= 0 || d.ChunkSize%Alignment != 0 {
		return ferr(n, "header.data.chunk_size", "%d is not a positive multiple of %d", d.ChunkSize, Alignment)
	}
	if want := (d.Size + d.ChunkSize - 1) / d.ChunkSize; int64(len(d.Chunks)) != want {
		return ferr(n, "header.data.chunk_sha256", "has %d entries, want %d for %d bytes in chunks of %d", len(d.Chunks), want, d.Size, d.ChunkSize)
	}
	for i, c := range d.Chunks {
		if !hex64.MatchString(c) {
			return ferr(n, fmt.Sprintf("header.data.chunk_sha256[%d]", i), "%q is not 64 lowercase hex digits", c)
		}
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
		if !slices.Contains(RequiredSections, s.Name) && !slices.Contains(OptionalSections, s.Name) {
			return ferr(n, f+".name", "%q is not a known section (known: %v, %v)", s.Name, RequiredSections, OptionalSections)
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
	region, err := checkSpan("header.tensor_data", h.TensorData.Offset, h.TensorData.Size)
	if err != nil {
		return err
	}
	outer = append(outer, region)
	if err := noOverlap(n, outer, func(s span) (string, int64, int64) { return s.field, s.off, s.end }); err != nil {
		return err
	}

	var inner []span
	names := map[string]bool{}
	for i, t := range h.Tensors {
		f := fmt.Sprintf("header.tensors[%d]", i)
		if t.Name == "" {
			return ferr(n, f+".name", "is empty")
		}
		if names[t.Name] {
			return ferr(n, f+".name", "%q appears twice", t.Name)
		}
		es, ok := dtypeSize[t.DType]
		if !ok {
			return ferr(n, f+".dtype", "%q is not supported (tensor %q; F32, BF16 or F16)", t.DType, t.Name)
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
		names[t.Name] = true
	}
	if err := noOverlap(n, inner, func(s span) (string, int64, int64) { return s.field, s.off, s.end }); err != nil {
		return err
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
	if want := storageDType[b.Precision]; b.StorageDType != want {
		return ferr(n, "provenance.build.storage_dtype", "%q, want %q for precision %s", b.StorageDType, want, b.Precision)
	}
	for i, t := range h.Tensors {
		if t.DType != b.StorageDType {
			return ferr(n, fmt.Sprintf("header.tensors[%d].dtype", i), "%q of tensor %q differs from the build's storage dtype %q", t.DType, t.Name, b.StorageDType)
		}
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

func isObject(raw json.RawMessage) bool {
	var m map[string]json.RawMessage
	return json.Unmarshal(raw, &m) == nil && m != nil
}

func validCheckpointID(id string) bool {
	org, name, ok := bytes.Cut([]byte(id), []byte("/"))
	return ok && len(org) > 0 && len(name) > 0 && !bytes.Contains(name, []byte("/"))
}

// checkPrecisionBackend accepts fp32, bf16 and fp16 on either backend: a bundle stores its
// tensors at that precision; the CPU runtime computes in fp32 from them (converting bf16 and fp16
// at load), the CUDA backend computes in the bundle's precision.
func checkPrecisionBackend(precision, backend string) error {
	if _, ok := storageDType[precision]; !ok {
		return fmt.Errorf("precision %q is not one of fp32, bf16, fp16", precision)
	}
	if backend != "cpu" && backend != "cuda" {
		return fmt.Errorf("backend %q is not one of cpu, cuda", backend)
	}
	return nil
}

func align(n int64) int64 { return (n + Alignment - 1) / Alignment * Alignment }
