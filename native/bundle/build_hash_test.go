package bundle

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
)

// randomBytes returns n deterministic pseudo-random bytes (seeded by seed): tensor data whose
// every chunk hashes differently, so a chunk sum recorded in the wrong place shows.
func randomBytes(seed uint64, n int64) []byte {
	r := rand.New(rand.NewPCG(seed, 0x6d71))
	b := make([]byte, (n+7)/8*8)
	for i := 0; i < len(b); i += 8 {
		binary.LittleEndian.PutUint64(b[i:], r.Uint64())
	}
	return b[:n]
}

// randomTensor is a tensor of dtype and shape filled with randomBytes(seed).
func randomTensor(name, dtype string, seed uint64, shape ...int64) stEntry {
	n := map[string]int64{"F32": 4, "BF16": 2, "F16": 2, "U8": 1}[dtype]
	for _, d := range shape {
		n *= d
	}
	return stEntry{name, dtype, shape, randomBytes(seed, n)}
}

// writeShardedCheckpoint writes a checkpoint of tinyGPT2Config's config and tokenizer files
// whose tensors are spread over shards model-0000i-of-0000n.safetensors, with the index a
// sharded Hugging Face checkpoint has.
func writeShardedCheckpoint(t testing.TB, dir string, shards [][]stEntry) {
	t.Helper()
	writeCheckpoint(t, dir, tinyGPT2Config, nil)
	wm := map[string]string{}
	for i, entries := range shards {
		name := fmt.Sprintf("model-%05d-of-%05d.safetensors", i+1, len(shards))
		writeST(t, filepath.Join(dir, name), entries)
		for _, e := range entries {
			wm[e.name] = name
		}
	}
	idx, _ := json.Marshal(map[string]any{"metadata": map[string]any{}, "weight_map": wm})
	if err := os.WriteFile(filepath.Join(dir, "model.safetensors.index.json"), idx, 0o644); err != nil {
		t.Fatal(err)
	}
}

// wantDataSHA256 is the sha256 of the data (everything after the header) of the bundle that
// TestBuildHashesAreSequentialSHA256 builds, as the builder of commit 913f060, which hashed in
// one goroutine, wrote it: hashing in parallel must not change a byte. The data does not depend
// on the header's length (it starts at a multiple of 64 and everything in it is aligned
// relative to that), so a longer Go version or builder revision does not change it.
const wantDataSHA256 = "7018f0699b93d81a876541a8d7f6b1c97b974035838775e9c2a97a385e85fa75"

// TestBuildHashesAreSequentialSHA256: the bundle of a three-shard checkpoint, its chunk sums
// (three chunks, boundaries inside tensors), section sums, header sum and the provenance's
// file sums are what crypto/sha256 computes sequentially over the same bytes, and the data is
// byte for byte what the sequential builder wrote, whatever the number of hashing goroutines.
func TestBuildHashesAreSequentialSHA256(t *testing.T) {
	dir := t.TempDir()
	ckpt := filepath.Join(dir, "ckpt")
	// Tensors sort a.*, b.*, c.*: the writer reads the shards in turn; b.half is converted
	// BF16 -> F32 (24 MB), so the 16 MB chunk boundaries fall inside a.big and b.half.
	writeShardedCheckpoint(t, ckpt, [][]stEntry{
		{randomTensor("a.big", "F32", 1, 3000, 1001), randomTensor("a.odd", "F32", 2, 7, 3)},
		{randomTensor("b.half", "BF16", 3, 3001, 2000), randomTensor("b.mask", "U8", 4, 5)},
		{randomTensor("c.big", "F32", 5, 2500, 999), randomTensor("c.f16", "F16", 6, 333, 3)},
	})
	old := SourceRevision
	SourceRevision = "test"
	defer func() { SourceRevision = old }()

	var data0 []byte
	for _, procs := range []int{1, 4} {
		t.Run(fmt.Sprintf("GOMAXPROCS=%d", procs), func(t *testing.T) {
			defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(procs))
			out := filepath.Join(dir, fmt.Sprintf("b%d.mqb", procs))
			if _, err := Build(context.Background(), BuildOptions{CheckpointDir: ckpt, Model: "a/b", Revision: testRev, Out: out, Resolve: testResolve}); err != nil {
				t.Fatal(err)
			}
			b, err := os.ReadFile(out)
			if err != nil {
				t.Fatal(err)
			}
			h, hlen := parseFile(t, b)
			sha := func(p []byte) string { s := sha256.Sum256(p); return hex.EncodeToString(s[:]) }

			if hs := sha256.Sum256(b[prefixSize : prefixSize+hlen]); !bytes.Equal(b[24:56], hs[:]) {
				t.Errorf("prefix holds header sha256 %x, the header hashes to %x", b[24:56], hs)
			}
			d := h.Data
			if d.Offset+d.Size != int64(len(b)) || d.ChunkSize != ChunkSize {
				t.Fatalf("data [%d, +%d) in chunks of %d, file of %d bytes", d.Offset, d.Size, d.ChunkSize, len(b))
			}
			if len(d.Chunks) != 3 {
				t.Fatalf("%d chunks, want 3 (the fixture is sized for three)", len(d.Chunks))
			}
			for i, got := range d.Chunks {
				lo := d.Offset + int64(i)*ChunkSize
				if want := sha(b[lo:min(lo+ChunkSize, int64(len(b)))]); got != want {
					t.Errorf("data.chunks[%d] = %s, bytes [%d, +%d) hash to %s", i, got, lo, ChunkSize, want)
				}
			}
			for _, s := range h.Sections {
				if want := sha(b[s.Offset : s.Offset+s.Size]); s.SHA256 != want {
					t.Errorf("section %s sha256 = %s, its bytes hash to %s", s.Name, s.SHA256, want)
				}
			}
			// Every file of the checkpoint is recorded with the sha256 of its bytes.
			want := map[string]string{}
			filepath.WalkDir(ckpt, func(p string, e fs.DirEntry, err error) error {
				if err == nil && !e.IsDir() {
					want[strings.TrimPrefix(p, ckpt+"/")] = sha(must(os.ReadFile(p)))
				}
				return err
			})
			if !slices.Equal(sortedKeys(h.Provenance.Files), sortedKeys(want)) {
				t.Errorf("provenance.files lists %v, the checkpoint holds %v", sortedKeys(h.Provenance.Files), sortedKeys(want))
			}
			for f, w := range want {
				if got := h.Provenance.Files[f]; got != w {
					t.Errorf("provenance.files[%s] = %s, the file hashes to %s", f, got, w)
				}
			}
			if got := sha(b[d.Offset:]); got != wantDataSHA256 {
				t.Errorf("data hashes to %s, the sequential builder's to %s", got, wantDataSHA256)
			}
			if data0 == nil {
				data0 = b[d.Offset:]
			} else if !bytes.Equal(b[d.Offset:], data0) {
				t.Errorf("data differs from the GOMAXPROCS=1 build's")
			}
		})
	}
}

// BenchmarkBuild measures Build on a synthetic checkpoint of 256 MB of tensors in four
// 64 MB shards (in the page cache after the first iteration, as a checkpoint just downloaded
// is), written to a temporary directory: F32 is copied as it is (reading, hashing the shards
// for provenance, hashing the bundle's chunks and writing are all there is), BF16 is widened
// to F32 (a 512 MB bundle). b.SetBytes makes the figure checkpoint bytes per second.
func BenchmarkBuild(b *testing.B) {
	for _, dtype := range []string{"F32", "BF16"} {
		b.Run(dtype, func(b *testing.B) {
			dir := b.TempDir()
			ckpt := filepath.Join(dir, "ckpt")
			const shards, perShard, shardBytes = 4, 4, 64 << 20
			var st [][]stEntry
			esize := map[string]int64{"F32": 4, "BF16": 2}[dtype]
			for s := range shards {
				var entries []stEntry
				for k := range perShard {
					rows := int64(shardBytes / perShard / esize / 1024)
					entries = append(entries, randomTensor(fmt.Sprintf("s%d.t%d", s, k), dtype, uint64(s*perShard+k), rows, 1024))
				}
				st = append(st, entries)
			}
			writeShardedCheckpoint(b, ckpt, st)
			st = nil
			out := filepath.Join(dir, "bench.mqb")
			b.SetBytes(shards * shardBytes)
			for b.Loop() {
				if _, err := Build(context.Background(), BuildOptions{CheckpointDir: ckpt, Model: "a/b", Revision: testRev, Out: out, Resolve: testResolve}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestBuildCancelled: a cancelled build says so, leaves no file behind, and returns only once
// its hashing has stopped (the race detector sees the shard hashing and chunk hashing wound
// down with it).
func TestBuildCancelled(t *testing.T) {
	dir := t.TempDir()
	ckpt := filepath.Join(dir, "ckpt")
	writeShardedCheckpoint(t, ckpt, [][]stEntry{
		{randomTensor("a", "F32", 1, 1024, 1024)},
		{randomTensor("b", "F32", 2, 1024, 1024)},
	})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	out := filepath.Join(dir, "x.mqb")
	_, err := Build(ctx, BuildOptions{CheckpointDir: ckpt, Model: "a/b", Revision: testRev, Out: out, Resolve: testResolve})
	if !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "build cancelled") {
		t.Fatalf("Build with a cancelled context = %v, want it to say the build was cancelled", err)
	}
	if left, _ := filepath.Glob(filepath.Join(dir, "x.mqb*")); len(left) != 0 {
		t.Errorf("a cancelled build left %v", left)
	}
}

// TestFileSHA256: a file hashes as crypto/sha256 of its bytes, and a cancelled context stops
// the hashing with an error naming the file.
func TestFileSHA256(t *testing.T) {
	data := randomBytes(9, 3<<20+5)
	p := writeTemp(t, "f", data)
	want := sha256.Sum256(data)
	if got, err := fileSHA256(context.Background(), p); err != nil || got != hex.EncodeToString(want[:]) {
		t.Errorf("fileSHA256 = %s, %v, want %x", got, err, want)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := fileSHA256(ctx, p); !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), p) {
		t.Errorf("fileSHA256 with a cancelled context = %v, want context.Canceled naming %s", err, p)
	}
}
