package server

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/modelqual/modelqual/fixtures"
)

// TestTokenizerFromAnotherFileRefused: the frontend reads the tokenizer while the bundle is
// hashed; if the file it read is not the one verified (written meanwhile), the start fails
// rather than serving a tokenizer nobody verified.
func TestTokenizerFromAnotherFileRefused(t *testing.T) {
	src, err := fixtures.MockBundle(fixtures.DefaultCacheDir(), 0)
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	path := t.TempDir() + "/b.mqb"
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	s := &Server{cfg: Config{Bundle: path}}
	v, err := s.verifyBundle()
	if err != nil {
		t.Fatal(err)
	}
	read, err := s.loadFrontend()
	if err != nil {
		t.Fatal(err)
	}
	if err := s.checkTokenizerSource(v, read); err != nil {
		t.Fatalf("tokenizer read from the verified file refused: %v", err)
	}
	later := time.Now().Add(time.Hour)
	if err := os.Chtimes(path, later, later); err != nil {
		t.Fatal(err)
	}
	if read, err = s.loadFrontend(); err != nil {
		t.Fatal(err)
	}
	err = s.checkTokenizerSource(v, read)
	if err == nil || !strings.Contains(err.Error(), "bundle "+path+" changed while qual-server was starting") {
		t.Fatalf("tokenizer read from a changed file: %v, want an error naming the file", err)
	}
}
