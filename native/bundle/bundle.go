package bundle

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"runtime"
	"strings"
	"sync"
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

// Open validates a bundle completely — structure and header checksum (ReadHeader), the sha256
// of every data chunk and of every section — and maps it read-only. A corrupted, truncated or
// malformed file is an error naming the file and the field; Open never panics. The chunks are
// hashed in parallel on every core, so verification runs at several GB/s; Open also yields the
// bundle's Digest and what OpenVerified needs to map it again in another process without
// hashing (Verified).
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
	if v.SHA256 != b.header.digest {
		_ = syscall.Munmap(b.data)
		return nil, fmt.Errorf("bundle %s: %w since it was verified (digest %s, was %s)", path, ErrChanged, b.header.digest, v.SHA256)
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

// verify hashes every data chunk (in parallel) and every section and compares them with the
// header's sums.
func (b *Bundle) verify() error {
	h := b.header
	if traceHashPass != nil {
		traceHashPass(b.path, len(b.data))
	}
	d := h.Data
	got := hashChunks(b.data[d.Offset:d.Offset+d.Size], d.ChunkSize)
	for i, want := range d.Chunks {
		if got[i] != want {
			lo := d.Offset + int64(i)*d.ChunkSize
			return ferr(b.path, fmt.Sprintf("header.data.chunk_sha256[%d]", i),
				"mismatch for bytes [%d, %d): header says %s, data hashes to %s (the file is corrupted%s)", lo, min(lo+d.ChunkSize, d.Offset+d.Size), want, got[i], b.whatLiesAt(lo, lo+d.ChunkSize))
		}
	}
	for i, s := range h.Sections {
		if got := sumBytes(b.data[s.Offset : s.Offset+s.Size]); got != s.SHA256 {
			return ferr(b.path, fmt.Sprintf("header.sections[%d].sha256", i),
				"mismatch for section %q: header says %s, data hashes to %s (the file is corrupted)", s.Name, s.SHA256, got)
		}
	}
	b.verified.SHA256 = h.digest
	return b.checkConfigSections()
}

// whatLiesAt names the sections and first tensor overlapping [lo, hi), for a mismatch message.
func (b *Bundle) whatLiesAt(lo, hi int64) string {
	var names []string
	for _, s := range b.header.Sections {
		if s.Offset < hi && s.Offset+s.Size > lo {
			names = append(names, "section "+s.Name)
		}
	}
	for _, t := range b.header.Tensors {
		if t.Offset < hi && t.Offset+t.Size > lo {
			names = append(names, "tensor "+t.Name)
			break
		}
	}
	if len(names) == 0 {
		return ""
	}
	return "; it holds " + strings.Join(names, ", ")
}

// hashChunks returns the sha256 of each chunkSize piece of data, hashed on every core.
func hashChunks(data []byte, chunkSize int64) []string {
	p := newSumPool(int((int64(len(data)) + chunkSize - 1) / chunkSize))
	for lo := int64(0); lo < int64(len(data)); lo += chunkSize {
		piece := data[lo:min(lo+chunkSize, int64(len(data)))]
		p.add(func() (string, error) { return sumBytes(piece), nil })
	}
	sums, _ := p.wait() // the jobs cannot fail
	return sums
}

// sumPool computes sha256 sums on up to GOMAXPROCS goroutines, each kept at the place of its
// job in the order the jobs were handed over. One sha256 is sequential (about 2 GB/s on one
// core with SHA-NI), so hashing gigabytes at the speed of several cores needs independent
// pieces: a bundle's data chunks (Open verifying the mapped file through hashChunks, Build
// hashing each chunk it writes while it fills the next) and a checkpoint's shard files (Build's
// provenance, hashed while the bundle is written).
type sumPool struct {
	sums    []string
	errs    []error
	jobs    chan sumJob
	wg      sync.WaitGroup
	workers int
	n       int  // jobs handed over
	done    bool // wait has run
}

type sumJob struct {
	i   int
	sum func() (string, error)
}

// newSumPool starts the workers for at most n jobs (no more than there are jobs).
func newSumPool(n int) *sumPool {
	p := &sumPool{sums: make([]string, n), errs: make([]error, n), jobs: make(chan sumJob), workers: min(runtime.GOMAXPROCS(0), n)}
	for range p.workers {
		p.wg.Go(func() {
			for j := range p.jobs {
				p.sums[j.i], p.errs[j.i] = j.sum()
			}
		})
	}
	return p
}

// add hands the next job to a worker, waiting until one is free: a producer that outpaces the
// hashing is held back, so at most one job per worker is in flight (which bounds the buffers
// Build keeps for its chunks). Only one goroutine may add, and at most n jobs.
func (p *sumPool) add(sum func() (string, error)) {
	if p.n == len(p.sums) {
		panic(fmt.Sprintf("bundle: internal error: sum job %d of a pool planned for %d", p.n+1, len(p.sums)))
	}
	p.jobs <- sumJob{p.n, sum}
	p.n++
}

// wait returns the sums of the jobs added, in order, once all have run, or the error of the
// first (in that order) that failed. It stops the workers; later calls return the same.
func (p *sumPool) wait() ([]string, error) {
	if !p.done {
		close(p.jobs)
		p.wg.Wait()
		p.done = true
	}
	for _, err := range p.errs[:p.n] {
		if err != nil {
			return nil, err
		}
	}
	return p.sums[:p.n], nil
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

// traceHashPass, when set (by the modelqual_hashtrace build tag, see hashtrace.go), is told of
// every hashing pass over a bundle file.
var traceHashPass func(path string, size int)

// sumBytes is how verification hashes; tests count what it is fed.
var sumBytes = sum

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

// Digest identifies the bundle file: the sha256 of its prefix, which holds the header's sha256,
// which lists every data chunk's sha256, so any change to any byte changes it. It is what a
// qualification records for "what was served" (README "Bundles").
func (b *Bundle) Digest() string { return b.header.digest }

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
	return nil, fmt.Errorf("bundle %s: section %q is not in the bundle", b.path, name)
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
	Family       string // runtime family, e.g. qwen3
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
