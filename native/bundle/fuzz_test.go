package bundle

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// FuzzReadHeader feeds arbitrary files to the header parser: it must never panic, every error
// must name the file, and a header it accepts must only point inside the file. The committed
// seed corpus (testdata/fuzz/FuzzReadHeader) runs with plain `go test`; regenerate it with
// MODELQUAL_WRITE_FUZZ_SEEDS=1 go test -run TestWriteFuzzSeeds ./native/bundle.
func FuzzReadHeader(f *testing.F) {
	for _, s := range fuzzSeeds(f) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		h, err := ReadHeader(bytes.NewReader(data), int64(len(data)), "fuzz.mqb")
		if err != nil {
			if !strings.HasPrefix(err.Error(), "bundle fuzz.mqb: ") {
				t.Fatalf("error does not name the file: %v", err)
			}
			return
		}
		size := int64(len(data))
		for _, s := range h.Sections {
			if s.Offset < 0 || s.Offset+s.Size > size {
				t.Fatalf("accepted section %+v outside %d bytes", s, size)
			}
		}
		for _, tn := range h.Tensors {
			if tn.Offset%Alignment != 0 || tn.Offset+tn.Size > size || tn.Offset < h.TensorData.Offset {
				t.Fatalf("accepted tensor %+v outside the file or region", tn)
			}
		}
	})
}

// fuzzSeeds are valid bundles (a tiny gpt2 and a mock) and a few near-misses.
func fuzzSeeds(t testing.TB) [][]byte {
	_, good := buildTiny(t)
	dir := t.TempDir()
	writeCheckpoint(t, dir, tinyGPT2Config, nil)
	out := filepath.Join(dir, "m.mqb")
	if _, err := Build(context.Background(), BuildOptions{Mock: true, MockVocab: 6, MaxContext: 8, TokenizerDir: dir, Out: out}); err != nil {
		t.Fatal(err)
	}
	mock, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	return [][]byte{good, mock, good[:len(good)/2], mock[:100], []byte(Magic)}
}

func TestWriteFuzzSeeds(t *testing.T) {
	if os.Getenv("MODELQUAL_WRITE_FUZZ_SEEDS") == "" {
		t.Skip("set MODELQUAL_WRITE_FUZZ_SEEDS=1 to rewrite testdata/fuzz/FuzzReadHeader")
	}
	dir := filepath.Join("testdata", "fuzz", "FuzzReadHeader")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for i, s := range fuzzSeeds(t) {
		body := fmt.Sprintf("go test fuzz v1\n[]byte(%q)\n", s)
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("seed-%02d", i)), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
