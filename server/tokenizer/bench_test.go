package tokenizer

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// benchText is ~12 KB of ordinary English prose, repeated to make a 1 MB input, the kind of
// prompt text the server encodes most.
const benchParagraph = `The quick brown fox jumps over the lazy dog. In the beginning of the twentieth century,
researchers began to study how language models could predict the next word in a sentence, and
they discovered that simple statistics, when gathered over millions of documents, captured a
surprising amount of grammar and meaning. Today's systems aren't so different: they're trained
on text, they've learned patterns, and we'll keep measuring them. "Quotes", (parentheses), and
numbers like 42, 3.14159 and 2026 appear too; so do e-mail addresses such as someone@example.com.
`

func benchInput() string {
	return strings.Repeat(benchParagraph, (1<<20)/len(benchParagraph)+1)
}

// benchEncode reports wall-clock MB/s (b.SetBytes) of one goroutine, i.e. per core, and the
// same figure over process CPU time, which stays meaningful on a busy machine.
func benchEncode(b *testing.B, name string, text string, fresh bool) {
	tok := fixtureTokenizer(b, name)
	b.SetBytes(int64(len(text)))
	b.ResetTimer()
	cpu0 := processCPU()
	n := 0
	for b.Loop() {
		if fresh {
			tok.model.(*bpeModel).cache.init()
		}
		tok.Encode(text)
		n++
	}
	if cpu := (processCPU() - cpu0).Seconds(); cpu > 0 {
		b.ReportMetric(float64(n*len(text))/1e6/cpu, "MB/cpu-s")
	}
}

func BenchmarkEncodeQwen3English(b *testing.B) { benchEncode(b, "qwen3", benchInput(), false) }

func BenchmarkEncodeGPT2English(b *testing.B) { benchEncode(b, "gpt2", benchInput(), false) }

// BenchmarkEncodeQwen3EnglishUncached measures the cold path: an empty word cache each time.
func BenchmarkEncodeQwen3EnglishUncached(b *testing.B) {
	benchEncode(b, "qwen3", benchInput()[:64<<10], true)
}

func BenchmarkLoadQwen3(b *testing.B) {
	dir := filepath.Join(repoRoot(b), "fixtures", "tokenizers", "qwen3")
	tj, err := os.ReadFile(filepath.Join(dir, "tokenizer.json"))
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(tj)))
	cpu0 := processCPU()
	n := 0
	for b.Loop() {
		if _, err := Load(dir); err != nil {
			b.Fatal(err)
		}
		n++
	}
	// CPU time per load (all threads, GC included) is steadier than wall time on a busy
	// machine, and is what a server start pays.
	b.ReportMetric(float64((processCPU()-cpu0).Milliseconds())/float64(n), "cpu-ms/op")
}

func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkEncodeQwen3EnglishParallel encodes from every core at once (b.SetBytes counts all
// goroutines): the shared word cache must not serialize concurrent requests.
func BenchmarkEncodeQwen3EnglishParallel(b *testing.B) {
	tok := fixtureTokenizer(b, "qwen3")
	text := benchInput()[:64<<10]
	b.SetBytes(int64(len(text)))
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			tok.Encode(text)
		}
	})
}

// BenchmarkFluxPromptEncode measures one FLUX prompt through both of its tokenizers as the
// pipeline calls them (CLIP padded to 77, T5 padded to 512), warm caches.
func BenchmarkFluxPromptEncode(b *testing.B) {
	clip, err := Load(fixtureDir(b, clipDir))
	if err != nil {
		b.Fatal(err)
	}
	t5, err := Load(fixtureDir(b, t5Dir))
	if err != nil {
		b.Fatal(err)
	}
	prompt := "A majestic red fox standing in fresh snow at dawn, soft golden light filtering through tall pine trees, photorealistic"
	b.SetBytes(int64(len(prompt)))
	for b.Loop() {
		if _, _, err := clip.EncodePadded(prompt, 77); err != nil {
			b.Fatal(err)
		}
		if _, _, err := t5.EncodePadded(prompt, 512); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkPrimeLlama measures what priming a stream with its prompt costs a SentencePiece
// family per request (the prompt's pieces run through the decoder once, the text thrown
// away, up to the point where the rest can no longer change the state), beside encoding the
// same prompt, which every request pays anyway: 8 KB of prose on llama-tiny's tokenizer.
func BenchmarkPrimeLlama(b *testing.B) {
	tok, err := Load(filepath.Join(repoRoot(b), "fixtures", "tokenizers", "llama-tiny"))
	if err != nil {
		b.Fatal(err)
	}
	text := benchInput()[:8<<10]
	ids := tok.Encode(text)
	b.Logf("prompt: %d bytes, %d tokens", len(text), len(ids))
	b.Run("prime", func(b *testing.B) {
		for b.Loop() {
			tok.NewStreamDecoder().Prime(ids)
		}
	})
	b.Run("encode", func(b *testing.B) {
		for b.Loop() {
			tok.Encode(text)
		}
	})
}
