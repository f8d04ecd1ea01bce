package bundle

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"hash"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// countingHash counts the bytes written into a sha256.
type countingHash struct {
	hash.Hash
	n atomic.Int64
}

func (c *countingHash) Write(p []byte) (int, error) {
	c.n.Add(int64(len(p)))
	return c.Hash.Write(p)
}

// countHashes makes every hash of the package a countingHash until the test ends, and returns
// the hashes made so far.
func countHashes(t *testing.T) func() []*countingHash {
	var made []*countingHash
	old := newSHA256
	newSHA256 = func() hash.Hash {
		h := &countingHash{Hash: sha256.New()}
		made = append(made, h)
		return h
	}
	t.Cleanup(func() { newSHA256 = old })
	return func() []*countingHash { r := made; made = nil; return r }
}

// TestOpenHashesOnceOpenVerifiedNever: Open reads the file through sha256 once (one hash fed
// the whole file, one per section and the tensor data fed just their bytes), and OpenVerified
// of what it returned hashes nothing yet serves the same digest.
func TestOpenHashesOnceOpenVerifiedNever(t *testing.T) {
	path, good := buildTiny(t)
	made := countHashes(t)
	b, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	h := b.Header()
	want := []int64{int64(len(good))} // the whole file, then each span in digest's order
	for _, s := range h.Sections {
		want = append(want, s.Size)
	}
	want = append(want, h.TensorData.Size)
	hs := made()
	if len(hs) != len(want) {
		t.Fatalf("Open made %d hashes, want %d (the file, %d sections, the tensor data)", len(hs), len(want), len(h.Sections))
	}
	for i, c := range hs {
		if c.n.Load() != want[i] {
			t.Errorf("hash %d of Open was fed %d bytes, want %d (one pass)", i, c.n.Load(), want[i])
		}
	}
	if s := sha256.Sum256(good); b.FileSHA256() != hex.EncodeToString(s[:]) {
		t.Errorf("FileSHA256 = %s, the file hashes to %x", b.FileSHA256(), s)
	}
	v := b.Verified()
	b.Close()

	b2, err := OpenVerified(path, v)
	if err != nil {
		t.Fatal(err)
	}
	defer b2.Close()
	if n := len(made()); n != 0 {
		t.Errorf("OpenVerified made %d hashes, want none", n)
	}
	if b2.FileSHA256() != v.SHA256 || b2.Verified() != v {
		t.Errorf("OpenVerified serves %s, Open verified %s", b2.FileSHA256(), v.SHA256)
	}
	if sec, err := b2.Section(SectionConfig); err != nil || !bytes.Contains(sec, []byte(`"n_embd"`)) {
		t.Errorf("OpenVerified's config section = %q, %v", sec, err)
	}
}

// TestOpenVerifiedRefusesAChangedFile: a bundle rewritten, replaced or touched after Open is
// not mapped on Open's word; the error names the file, says what changed and wraps ErrChanged,
// and Open of a corrupted rewrite names the mismatching digest.
func TestOpenVerifiedRefusesAChangedFile(t *testing.T) {
	_, good := buildTiny(t)
	corrupt := bytes.Clone(good)
	corrupt[len(corrupt)-1] ^= 0x01
	cases := []struct {
		name   string
		change func(t *testing.T, path string)
		detail string
	}{
		{"rewritten in place, same size", func(t *testing.T, path string) {
			if err := os.WriteFile(path, corrupt, 0o644); err != nil {
				t.Fatal(err)
			}
		}, "modified"},
		{"replaced by rename", func(t *testing.T, path string) {
			tmp := filepath.Join(filepath.Dir(path), "new.mqb")
			if err := os.WriteFile(tmp, corrupt, 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.Rename(tmp, path); err != nil {
				t.Fatal(err)
			}
		}, "replaced"},
		{"touched", func(t *testing.T, path string) {
			later := time.Now().Add(time.Hour)
			if err := os.Chtimes(path, later, later); err != nil {
				t.Fatal(err)
			}
		}, "modified"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			path := writeTemp(t, "b.mqb", good)
			// File times tick coarsely (a few milliseconds on Linux): date the file back so
			// that a rewrite right after Open has a different modification time.
			past := time.Now().Add(-time.Hour)
			if err := os.Chtimes(path, past, past); err != nil {
				t.Fatal(err)
			}
			b, err := Open(path)
			if err != nil {
				t.Fatal(err)
			}
			v := b.Verified()
			b.Close()
			c.change(t, path)
			b2, err := OpenVerified(path, v)
			if err == nil {
				b2.Close()
				t.Fatal("OpenVerified mapped a changed file without hashing it")
			}
			for _, want := range []string{"bundle " + path + ": ", "changed since it was verified", c.detail} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q lacks %q", err, want)
				}
			}
			if !errors.Is(err, ErrChanged) {
				t.Errorf("error %v does not wrap ErrChanged", err)
			}
			if c.name == "touched" {
				return // same content: a new Open succeeds
			}
			if _, err := Open(path); err == nil || !strings.Contains(err.Error(), "header.tensor_data.sha256") {
				t.Errorf("Open of the corrupted rewrite = %v, want a tensor_data.sha256 mismatch", err)
			}
		})
	}
}

func TestOpenVerifiedNeedsAVerified(t *testing.T) {
	path, _ := buildTiny(t)
	if b, err := OpenVerified(path, Verified{}); err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "use Open") {
		if b != nil {
			b.Close()
		}
		t.Fatalf("OpenVerified(zero Verified) = %v, want an error naming the file and Open", err)
	}
}

func TestVerifiedText(t *testing.T) {
	path, _ := buildTiny(t)
	b, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	v := b.Verified()
	b.Close()
	text, err := v.MarshalText()
	if err != nil {
		t.Fatal(err)
	}
	var back Verified
	if err := back.UnmarshalText(text); err != nil || back != v {
		t.Fatalf("%s reads back as %+v, %v; want %+v", text, back, err, v)
	}
	var zero Verified
	if text, err := zero.MarshalText(); err != nil || len(text) != 0 {
		t.Errorf("the zero Verified writes %q, %v; want nothing", text, err)
	}
	if err := back.UnmarshalText(nil); err != nil || back != zero {
		t.Errorf("empty text reads as %+v, %v; want the zero Verified", back, err)
	}
	good := string(text)
	for _, bad := range []string{
		"sha256=abc", strings.Replace(good, "sha256=", "sha=", 1), strings.Replace(good, "size=", "size=x", 1),
		strings.Replace(good, "dev=", "dev=-", 1), good + ",extra=1", strings.Replace(good, v.SHA256, strings.ToUpper(v.SHA256), 1),
	} {
		var w Verified
		if err := w.UnmarshalText([]byte(bad)); err == nil || !strings.Contains(err.Error(), "MarshalText") {
			t.Errorf("UnmarshalText(%q) = %v, want an error saying what to pass", bad, err)
		}
	}
}

// TestDigestAcrossChunks: spans that start, end or lie inside chunks, cross chunk boundaries,
// overlap or are empty hash as sha256 of their bytes, and the file as sha256 of all of it.
func TestDigestAcrossChunks(t *testing.T) {
	data := make([]byte, 3*hashChunk+hashChunk/2)
	for i := range data {
		data[i] = byte(i*7 + i>>11)
	}
	n := int64(len(data))
	spans := [][2]int64{{0, n}, {64, hashChunk}, {hashChunk - 64, 2*hashChunk + 64}, {hashChunk, hashChunk}, {2*hashChunk + 1, n}, {100, 200}}
	file, sums := digest(data, spans)
	if want := sha256.Sum256(data); file != hex.EncodeToString(want[:]) {
		t.Errorf("file sum %s, want %x", file, want)
	}
	for i, s := range spans {
		if want := sha256.Sum256(data[s[0]:s[1]]); sums[i] != hex.EncodeToString(want[:]) {
			t.Errorf("span %v: sum %s, want %x", s, sums[i], want)
		}
	}
}
