package bundle

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"hash"
	"os"
	"syscall"
	"unsafe"
)

// Bundle is an opened, validated bundle whose whole file is mapped read-only. Tensor and
// section slices point into the mapping and are valid until Close; they must not be written.
// A Bundle is safe for concurrent readers.
type Bundle struct {
	path     string
	header   *Header
	data     []byte
	verified Verified
}

// Open validates a bundle completely — structure (ReadHeader) and the sha256 of every section
// and of the tensor data — and maps it read-only. A corrupted, truncated or malformed file is
// an error naming the file and the field; Open never panics. The file is hashed in one pass,
// which also yields the whole-file sha256 (FileSHA256) and what OpenVerified needs to map it
// again in another process without hashing (Verified).
func Open(path string) (*Bundle, error) {
	b, f, err := mapFile(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	err = b.verify()
	if err == nil {
		// The identity vouched for is the one before hashing; a write during the pass would
		// leave a digest of neither the old nor the new content.
		err = b.verified.id.check(f, path, "while it was being verified; make sure nothing writes the bundle while it is opened")
	}
	if err != nil {
		_ = syscall.Munmap(b.data)
		return nil, err
	}
	// Hashing touched every page. Drop them from this process's resident set (the page cache
	// keeps them; a later access maps them back without I/O), so that resident memory counts
	// what the engine actually uses rather than the whole file once more.
	_ = syscall.Madvise(b.data, syscall.MADV_DONTNEED)
	return b, nil
}

// OpenVerified maps a bundle that Open verified, possibly in another process, without hashing
// it again: qual-server's frontend opens the bundle once per start and its workers map it with
// what the frontend's Open returned, so a multi-gigabyte file is hashed once rather than once
// per process. The header is read and checked as by Open; the file must still have the
// identity it had when it was verified (device, inode, size, modification and change times),
// else the error wraps ErrChanged and the caller should Open it (hash it) again. The caller
// vouches that v came from Open, in this process or one it trusts.
func OpenVerified(path string, v Verified) (*Bundle, error) {
	if v.SHA256 == "" {
		return nil, fmt.Errorf("bundle %s: OpenVerified needs the Verified of an Open of this file; use Open", path)
	}
	b, f, err := mapFile(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if b.verified.id != v.id {
		err = b.verified.id.changedError(v.id, path, "since it was verified")
	} else {
		err = b.checkConfigSections()
	}
	if err != nil {
		_ = syscall.Munmap(b.data)
		return nil, err
	}
	b.verified.SHA256 = v.SHA256
	return b, nil
}

// mapFile reads and checks the header of path, notes the file's identity and maps it. The
// caller closes the file and, on error, unmaps the data.
func mapFile(path string) (*Bundle, *os.File, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, fmt.Errorf("bundle %s: open: %w; build one with qual bundle build", path, err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, nil, fmt.Errorf("bundle %s: stat: %w", path, err)
	}
	h, err := ReadHeader(f, st.Size(), path)
	if err != nil {
		f.Close()
		return nil, nil, err
	}
	if st.Size() > int64(^uint(0)>>1) {
		f.Close()
		return nil, nil, ferr(path, "file", "of %d bytes is too large to map", st.Size())
	}
	data, err := syscall.Mmap(int(f.Fd()), 0, int(st.Size()), syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		f.Close()
		return nil, nil, fmt.Errorf("bundle %s: mmap %d bytes: %w", path, st.Size(), err)
	}
	return &Bundle{path: path, header: h, data: data, verified: Verified{id: fileIDOf(st)}}, f, nil
}

// verify hashes the file in one pass (digest) and compares the sections' and the tensor
// data's sums with the header's.
func (b *Bundle) verify() error {
	h := b.header
	spans := make([][2]int64, 0, len(h.Sections)+1)
	for _, s := range h.Sections {
		spans = append(spans, [2]int64{s.Offset, s.Offset + s.Size})
	}
	td := h.TensorData
	spans = append(spans, [2]int64{td.Offset, td.Offset + td.Size})
	if traceHashPass != nil {
		traceHashPass(b.path, len(b.data))
	}
	fileSum, sums := digest(b.data, spans)
	b.verified.SHA256 = fileSum
	for i, s := range h.Sections {
		if got := sums[i]; got != s.SHA256 {
			return ferr(b.path, fmt.Sprintf("header.sections[%d].sha256", i),
				"mismatch for section %q: header says %s, data hashes to %s (the file is corrupted)", s.Name, s.SHA256, got)
		}
	}
	if got := sums[len(h.Sections)]; got != td.SHA256 {
		return ferr(b.path, "header.tensor_data.sha256", "mismatch: header says %s, data hashes to %s (the file is corrupted)", td.SHA256, got)
	}
	return b.checkConfigSections()
}

// checkConfigSections compares the header's config with the sections: the runtime reads
// hyperparameters from the header; the sections are what tokenizers and people read. They
// must say the same thing.
func (b *Bundle) checkConfigSections() error {
	h := b.header
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

// newSHA256 makes every hash digest uses; tests count the passes through it.
var newSHA256 = sha256.New

// traceHashPass, when set (by the modelqual_hashtrace build tag, see hashtrace.go), is told of
// every hashing pass over a bundle file.
var traceHashPass func(path string, size int)

// hashChunk is how far the whole-file hash and the span hashes move together: small enough
// that a chunk is still in the CPU cache when the second of them reads it, large enough that
// handing chunks over costs nothing next to hashing them.
const hashChunk = 1 << 20

// digest hashes data in one pass: each chunk goes into the whole-file sha256 and into the
// sha256 of every span [start, end) it overlaps. The whole-file hash runs on its own
// goroutine at most a few chunks behind, so on a multi-core machine the pass takes about as
// long as one sha256 of the file.
func digest(data []byte, spans [][2]int64) (file string, sums []string) {
	whole := newSHA256()
	hs := make([]hash.Hash, len(spans))
	for i := range hs {
		hs[i] = newSHA256()
	}
	chunks := make(chan []byte, 2)
	wholeDone := make(chan struct{})
	go func() {
		defer close(wholeDone)
		for c := range chunks {
			whole.Write(c)
		}
	}()
	size := int64(len(data))
	for off := int64(0); off < size; off += hashChunk {
		end := min(off+hashChunk, size)
		chunks <- data[off:end]
		for i, s := range spans {
			if lo, hi := max(off, s[0]), min(end, s[1]); lo < hi {
				hs[i].Write(data[lo:hi])
			}
		}
	}
	close(chunks)
	<-wholeDone
	sums = make([]string, len(hs))
	for i, h := range hs {
		sums[i] = hex.EncodeToString(h.Sum(nil))
	}
	return hex.EncodeToString(whole.Sum(nil)), sums
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

// FileSHA256 is the sha256 of the whole bundle file, computed by Open (or by the Open that
// OpenVerified trusts): the identity a qualification records for "what was served".
func (b *Bundle) FileSHA256() string { return b.verified.SHA256 }

// Verified is what OpenVerified needs to map this file again, in this process or another,
// without hashing it.
func (b *Bundle) Verified() Verified { return b.verified }

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
