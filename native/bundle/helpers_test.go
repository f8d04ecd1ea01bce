package bundle

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// tinyGPT2Config is a GPT-2 small enough that a whole bundle is a few kilobytes (fuzz seeds,
// table tests).
var tinyGPT2Config = map[string]any{
	"architectures": []string{"GPT2LMHeadModel"}, "model_type": "gpt2",
	"n_embd": 4, "n_head": 2, "n_layer": 1, "n_positions": 8, "vocab_size": 6,
	"bos_token_id": 5, "eos_token_id": 5, "layer_norm_epsilon": 1e-5,
}

const testRev = "0123456789abcdef0123456789abcdef01234567"

// stEntry is a tensor to write into a test safetensors file.
type stEntry struct {
	name  string
	dtype string
	shape []int64
	data  []byte
}

// f32Tensor makes an F32 tensor whose element i is base+i/100.
func f32Tensor(name string, base float32, shape ...int64) stEntry {
	n := int64(1)
	for _, d := range shape {
		n *= d
	}
	var b []byte
	for i := int64(0); i < n; i++ {
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(base+float32(i)/100))
	}
	return stEntry{name, "F32", shape, b}
}

// writeST writes a safetensors file (https://github.com/huggingface/safetensors#format).
func writeST(t testing.TB, path string, entries []stEntry) {
	t.Helper()
	hdr := map[string]any{"__metadata__": map[string]string{"format": "pt"}}
	var data []byte
	for _, e := range entries {
		hdr[e.name] = map[string]any{"dtype": e.dtype, "shape": e.shape, "data_offsets": []int{len(data), len(data) + len(e.data)}}
		data = append(data, e.data...)
	}
	hb, _ := json.Marshal(hdr)
	for len(hb)%8 != 0 {
		hb = append(hb, ' ')
	}
	out := binary.LittleEndian.AppendUint64(nil, uint64(len(hb)))
	out = append(append(out, hb...), data...)
	if err := os.WriteFile(path, out, 0o644); err != nil {
		t.Fatal(err)
	}
}

// gpt2Entries lists the tensors of tinyGPT2Config's GPT-2 (n_embd 4, 1 layer, vocab 6, 8
// positions) with deterministic values: tensor i holds i + j/100.
func gpt2Entries(t testing.TB, _ map[string]any) []stEntry {
	t.Helper()
	shapes := []struct {
		name  string
		shape []int64
	}{
		{"wte.weight", []int64{6, 4}}, {"wpe.weight", []int64{8, 4}},
		{"h.0.ln_1.weight", []int64{4}}, {"h.0.ln_1.bias", []int64{4}},
		{"h.0.attn.c_attn.weight", []int64{4, 12}}, {"h.0.attn.c_attn.bias", []int64{12}},
		{"h.0.attn.c_proj.weight", []int64{4, 4}}, {"h.0.attn.c_proj.bias", []int64{4}},
		{"h.0.ln_2.weight", []int64{4}}, {"h.0.ln_2.bias", []int64{4}},
		{"h.0.mlp.c_fc.weight", []int64{4, 16}}, {"h.0.mlp.c_fc.bias", []int64{16}},
		{"h.0.mlp.c_proj.weight", []int64{16, 4}}, {"h.0.mlp.c_proj.bias", []int64{4}},
		{"ln_f.weight", []int64{4}}, {"ln_f.bias", []int64{4}},
	}
	var out []stEntry
	for i, r := range shapes {
		out = append(out, f32Tensor(r.name, float32(i), r.shape...))
	}
	return out
}

// testResolve stands in for the runtime's registry (package bundle knows no family): GPT-2
// checkpoints are served by "gpt2", whose position limit is n_positions.
func testResolve(arch string, config json.RawMessage) (Family, error) {
	if arch != "GPT2LMHeadModel" {
		return Family{}, fmt.Errorf("architecture %q has no native family (test resolver knows GPT2LMHeadModel)", arch)
	}
	var c struct {
		N int `json:"n_positions"`
	}
	if err := json.Unmarshal(config, &c); err != nil {
		return Family{}, err
	}
	return Family{Name: "gpt2", Task: "text", MaxPositions: c.N}, nil
}

// writeCheckpoint writes a checkpoint directory: config, generation config, a two-file
// tokenizer and the given tensors in one model.safetensors.
func writeCheckpoint(t testing.TB, dir string, config map[string]any, entries []stEntry) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	files := map[string]string{
		"tokenizer.json":         `{"version":"1.0","model":{"type":"BPE","vocab":{"a":0}}}`,
		"tokenizer_config.json":  `{"eos_token":"<|endoftext|>"}`,
		"generation_config.json": `{"bos_token_id":5,"eos_token_id":5}`,
	}
	cb, _ := json.MarshalIndent(config, "", "  ")
	files["config.json"] = string(cb)
	for n, c := range files {
		if err := os.WriteFile(filepath.Join(dir, n), []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if entries != nil {
		writeST(t, filepath.Join(dir, "model.safetensors"), entries)
	}
}

// buildTiny builds a valid tiny gpt2 bundle and returns its path and bytes. The builder
// revision is padded so header mutations in tests have room to grow (see rewriteHeader).
func buildTiny(t testing.TB) (string, []byte) {
	t.Helper()
	dir := t.TempDir()
	writeCheckpoint(t, filepath.Join(dir, "ckpt"), tinyGPT2Config, gpt2Entries(t, tinyGPT2Config))
	old := SourceRevision
	SourceRevision = strings.Repeat("r", 400)
	defer func() { SourceRevision = old }()
	out := filepath.Join(dir, "tiny.mqb")
	if _, err := Build(context.Background(), BuildOptions{CheckpointDir: filepath.Join(dir, "ckpt"), Model: "test/tiny", Revision: testRev, Out: out, Resolve: testResolve}); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	return out, b
}

// parseFile splits a bundle into its decoded header and the header's reserved room.
func parseFile(t testing.TB, b []byte) (*Header, int) {
	t.Helper()
	hlen := int(binary.LittleEndian.Uint64(b[16:24]))
	var h Header
	if err := json.Unmarshal(b[prefixSize:prefixSize+hlen], &h); err != nil {
		t.Fatal(err)
	}
	return &h, hlen
}

// rewriteHeader applies mutate to the header and writes it back, with its checksum in the
// prefix updated, without moving any data (see editHeader): what a careful editor would do,
// so the structural checks behind the checksum are what catches the edit.
func rewriteHeader(t testing.TB, b []byte, mutate func(h *Header)) []byte {
	t.Helper()
	out := editHeader(t, b, mutate)
	hlen := int(binary.LittleEndian.Uint64(out[16:24]))
	sum := sha256.Sum256(out[prefixSize : prefixSize+hlen])
	copy(out[24:56], sum[:])
	return out
}

// editHeader applies mutate to the header and writes it back without moving any data and
// without updating the header's checksum: the builder revision (400 bytes of padding from
// buildTiny) is shortened to keep the JSON length, so every absolute offset in the file still
// points where it did.
func editHeader(t testing.TB, b []byte, mutate func(h *Header)) []byte {
	t.Helper()
	h, hlen := parseFile(t, b)
	mutate(h)
	h.Provenance.Builder.SourceRevision = ""
	nb, _ := json.Marshal(h)
	pad := hlen - len(nb)
	if pad < 0 {
		t.Fatalf("mutated header grew by %d bytes beyond the reserved room", -pad)
	}
	h.Provenance.Builder.SourceRevision = strings.Repeat("r", pad)
	nb, _ = json.Marshal(h)
	if len(nb) != hlen {
		t.Fatalf("header length %d, want %d", len(nb), hlen)
	}
	out := bytes.Clone(b)
	copy(out[prefixSize:], nb)
	return out
}

func writeTemp(t testing.TB, name string, b []byte) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func sortedKeys[V any](m map[string]V) []string {
	var k []string
	for n := range m {
		k = append(k, n)
	}
	sort.Strings(k)
	return k
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(fmt.Sprint("test setup: ", err))
	}
	return v
}
