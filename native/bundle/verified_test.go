package bundle

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestOpenHashesOnceOpenVerifiedNever: Open hashes every data byte once (in chunks) and the
// sections once more, and OpenVerified of what it returned hashes nothing yet serves the same
// digest.
func TestOpenHashesOnceOpenVerifiedNever(t *testing.T) {
	path, good := buildTiny(t)
	var hashed atomic.Int64
	old := sumBytes
	sumBytes = func(p []byte) string { hashed.Add(int64(len(p))); return old(p) }
	t.Cleanup(func() { sumBytes = old })
	b, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	h := b.Header()
	want := h.Data.Size
	for _, s := range h.Sections {
		want += s.Size
	}
	if got := hashed.Swap(0); got != want {
		t.Errorf("Open hashed %d bytes, want %d (the data once, the sections once more)", got, want)
	}
	if want := sha256.Sum256(good[:prefixSize]); b.Digest() != hex.EncodeToString(want[:]) {
		t.Errorf("Digest = %s, the prefix hashes to %x", b.Digest(), want)
	}
	v := b.Verified()
	b.Close()

	b2, err := OpenVerified(path, v)
	if err != nil {
		t.Fatal(err)
	}
	defer b2.Close()
	if n := hashed.Load(); n != 0 {
		t.Errorf("OpenVerified hashed %d bytes, want none", n)
	}
	if b2.Digest() != v.SHA256 || b2.Verified() != v {
		t.Errorf("OpenVerified serves %s, Open verified %s", b2.Digest(), v.SHA256)
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
			if _, err := Open(path); err == nil || !strings.Contains(err.Error(), "header.data.chunk_sha256") {
				t.Errorf("Open of the corrupted rewrite = %v, want a chunk_sha256 mismatch", err)
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

// TestHashChunks: every chunk, the last short one included, hashes as sha256 of its bytes,
// whatever the number of workers.
func TestHashChunks(t *testing.T) {
	data := make([]byte, 3*4096+100)
	for i := range data {
		data[i] = byte(i*7 + i>>11)
	}
	got := hashChunks(data, 4096)
	if len(got) != 4 {
		t.Fatalf("%d chunks, want 4", len(got))
	}
	for i := range got {
		want := sha256.Sum256(data[i*4096 : min((i+1)*4096, len(data))])
		if got[i] != hex.EncodeToString(want[:]) {
			t.Errorf("chunk %d: %s, want %x", i, got[i], want)
		}
	}
}
