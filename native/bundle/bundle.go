package bundle

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"sync"
	"syscall"
	"unsafe"
)

// Bundle is an opened, validated bundle whose whole file is mapped read-only. Tensor and
// section slices point into the mapping and are valid until Close; they must not be written.
// A Bundle is safe for concurrent readers.
type Bundle struct {
	path    string
	header  *Header
	data    []byte
	fileSum string
}

// Open validates a bundle completely — structure (ReadHeader) and the sha256 of every section
// and of the tensor data — and maps it read-only. A corrupted, truncated or malformed file is
// an error naming the file and the field; Open never panics.
func Open(path string) (*Bundle, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("bundle %s: open: %w; build one with qual bundle build", path, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("bundle %s: stat: %w", path, err)
	}
	h, err := ReadHeader(f, st.Size(), path)
	if err != nil {
		return nil, err
	}
	if st.Size() > int64(^uint(0)>>1) {
		return nil, ferr(path, "file", "of %d bytes is too large to map", st.Size())
	}
	data, err := syscall.Mmap(int(f.Fd()), 0, int(st.Size()), syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("bundle %s: mmap %d bytes: %w", path, st.Size(), err)
	}
	b := &Bundle{path: path, header: h, data: data}
	if err := b.verify(); err != nil {
		_ = syscall.Munmap(data)
		return nil, err
	}
	// Hashing touched every page. Drop them from this process's resident set (the page cache
	// keeps them; a later access maps them back without I/O), so that resident memory counts
	// what the engine actually uses rather than the whole file once more.
	_ = syscall.Madvise(data, syscall.MADV_DONTNEED)
	return b, nil
}

// verify hashes the sections, the tensor region and the whole file. The whole-file hash runs
// on its own goroutine so the two passes overlap on a multi-core machine.
func (b *Bundle) verify() error {
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		s := sha256.Sum256(b.data)
		b.fileSum = hex.EncodeToString(s[:])
	}()
	defer wg.Wait()
	h := b.header
	for i, s := range h.Sections {
		if got := sum(b.data[s.Offset : s.Offset+s.Size]); got != s.SHA256 {
			return ferr(b.path, fmt.Sprintf("header.sections[%d].sha256", i),
				"mismatch for section %q: header says %s, data hashes to %s (the file is corrupted)", s.Name, s.SHA256, got)
		}
	}
	td := h.TensorData
	if got := sum(b.data[td.Offset : td.Offset+td.Size]); got != td.SHA256 {
		return ferr(b.path, "header.tensor_data.sha256", "mismatch: header says %s, data hashes to %s (the file is corrupted)", td.SHA256, got)
	}
	// The runtime reads hyperparameters from the header; the sections are what tokenizers and
	// people read. They must say the same thing.
	for _, c := range []struct {
		field, section string
		header         json.RawMessage
	}{{"header.config", SectionConfig, h.Config}, {"header.generation_config", SectionGenerationConfig, h.GenerationConfig}} {
		sec, _ := b.Section(c.section)
		if !bytes.Equal(compactJSON(sec), compactJSON(c.header)) {
			return ferr(b.path, c.field, "differs from the %s section", c.section)
		}
	}
	return nil
}

func sum(p []byte) string {
	s := sha256.Sum256(p)
	return hex.EncodeToString(s[:])
}

// Header is the validated header. Callers must not modify it.
func (b *Bundle) Header() *Header { return b.header }

// Path is the file the bundle was opened from.
func (b *Bundle) Path() string { return b.path }

// Data is the whole read-only mapping (offsets in the header index into it).
func (b *Bundle) Data() []byte { return b.data }

// FileSHA256 is the sha256 of the whole bundle file, computed by Open: the identity a
// qualification records for "what was served".
func (b *Bundle) FileSHA256() string { return b.fileSum }

// Tensor returns a tensor's table entry and its bytes inside the mapping.
func (b *Bundle) Tensor(name string) (TensorInfo, []byte, error) {
	t, ok := b.header.Tensor(name)
	if !ok {
		return TensorInfo{}, nil, fmt.Errorf("bundle %s: tensor %q is not in the bundle (family %s)", b.path, name, b.header.Family)
	}
	return t, b.data[t.Offset : t.Offset+t.Size : t.Offset+t.Size], nil
}

// Float32s returns an F32 tensor as a []float32 view of the mapping (no copy; the data is
// 64-byte aligned and little-endian on every supported platform). Do not write to it.
func (b *Bundle) Float32s(name string) (TensorInfo, []float32, error) {
	t, raw, err := b.Tensor(name)
	if err != nil {
		return t, nil, err
	}
	if t.DType != "F32" {
		return t, nil, fmt.Errorf("bundle %s: tensor %q has dtype %s, want F32", b.path, name, t.DType)
	}
	return t, unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(raw))), len(raw)/4), nil
}

// Section returns a section's bytes inside the mapping.
func (b *Bundle) Section(name string) ([]byte, error) {
	for _, s := range b.header.Sections {
		if s.Name == name {
			return b.data[s.Offset : s.Offset+s.Size : s.Offset+s.Size], nil
		}
	}
	return nil, fmt.Errorf("bundle %s: section %q is not in the bundle (sections: %v)", b.path, name, RequiredSections)
}

// Close unmaps the file. Slices obtained from the bundle become invalid.
func (b *Bundle) Close() error {
	if b.data == nil {
		return nil
	}
	err := syscall.Munmap(b.data)
	b.data = nil
	if err != nil {
		return fmt.Errorf("bundle %s: munmap: %w", b.path, err)
	}
	return nil
}

// Expect is what a family manifest requires of a bundle. Empty strings and zero MaxContext
// are not checked.
type Expect struct {
	Family       string // native family: gpt2, qwen3, mock
	CheckpointID string
	Revision     string
	Precision    string
	Backend      string
	MaxContext   int
}

// MismatchError is returned by Check: the bundle is well formed but not the one the manifest
// names.
type MismatchError struct {
	File, Field, Have, Want string
}

func (e *MismatchError) Error() string {
	return fmt.Sprintf("bundle %s: %s is %q but the manifest expects %q; rebuild the bundle from the manifest's checkpoint and build settings",
		e.File, e.Field, e.Have, e.Want)
}

// Check compares the header with a manifest's expectations and names the first mismatching
// field, in the order family, checkpoint_id, revision, precision, backend, max_context.
func (h *Header) Check(e Expect) error {
	p := h.Provenance
	for _, c := range []struct{ field, have, want string }{
		{"family", h.Family, e.Family},
		{"provenance.checkpoint_id", p.CheckpointID, e.CheckpointID},
		{"provenance.revision", p.Revision, e.Revision},
		{"provenance.build.precision", p.Build.Precision, e.Precision},
		{"provenance.build.backend", p.Build.Backend, e.Backend},
	} {
		if c.want != "" && c.have != c.want {
			return &MismatchError{File: h.name, Field: c.field, Have: c.have, Want: c.want}
		}
	}
	if e.MaxContext != 0 && p.Build.MaxContext != e.MaxContext {
		return &MismatchError{File: h.name, Field: "provenance.build.max_context",
			Have: fmt.Sprint(p.Build.MaxContext), Want: fmt.Sprint(e.MaxContext)}
	}
	return nil
}
