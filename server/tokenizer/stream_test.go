package tokenizer

import (
	"math/rand/v2"
	"strings"
	"testing"

	"golang.org/x/text/unicode/norm"
)

// streamAll feeds ids one at a time and checks that every delta is valid UTF-8.
func streamAll(t *testing.T, tok *Tokenizer, ids []int32) string {
	t.Helper()
	return streamChecked(t, tok, ids, false)
}

func TestStreamDecoderGolden(t *testing.T) {
	g := loadGolden(t)
	for name, entries := range map[string][]goldenEncode{"gpt2": g.GPT2, "qwen3": g.Qwen3} {
		tok := fixtureTokenizer(t, name)
		for i, e := range entries {
			if got := streamAll(t, tok, e.IDs); got != e.Decoded {
				t.Errorf("%s[%d]: streamed %q, want %q", name, i, got, e.Decoded)
			}
		}
	}
}

// TestStreamDecoderHoldsPartialCharacters checks that an emoji split over byte tokens comes
// out whole, once, when its last byte arrives.
func TestStreamDecoderHoldsPartialCharacters(t *testing.T) {
	tok := fixtureTokenizer(t, "gpt2")
	var ids []int32
	for _, b := range []byte("😀") { // four byte-level tokens, one per byte
		id, ok := tok.SpecialID(string(byteToRune[b]))
		if !ok {
			t.Fatalf("no byte token for 0x%02x", b)
		}
		ids = append(ids, id)
	}
	d := tok.NewStreamDecoder()
	for i, id := range ids[:3] {
		if got := d.Add(id); got != "" {
			t.Fatalf("byte %d of 4 emitted %q before the character was complete", i+1, got)
		}
	}
	if got := d.Add(ids[3]); got != "😀" {
		t.Fatalf("last byte emitted %q, want the emoji", got)
	}
	// An incomplete character at the end is flushed as U+FFFD, like Decode renders it.
	d.Add(ids[0])
	if got, want := d.Flush(), tok.Decode(ids[:1]); got != want || got != "\uFFFD" {
		t.Fatalf("Flush of a dangling lead byte = %q, Decode = %q, want U+FFFD", got, want)
	}
}

// TestStreamDecoderRandomIDs checks the contract on arbitrary id sequences, which split
// characters in every possible way and include invalid byte sequences.
func TestStreamDecoderRandomIDs(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for _, name := range []string{"gpt2", "qwen3"} {
		tok := fixtureTokenizer(t, name)
		// Bias towards single-byte tokens (ids of the 256 byte characters) so multi-byte
		// characters are assembled and broken often.
		var byteIDs []int32
		for b := 0; b < 256; b++ {
			if id, ok := tok.SpecialID(string(byteToRune[b])); ok {
				byteIDs = append(byteIDs, id)
			}
		}
		for iter := 0; iter < 400; iter++ {
			ids := make([]int32, 1+r.IntN(30))
			for i := range ids {
				switch r.IntN(3) {
				case 0:
					ids[i] = byteIDs[r.IntN(len(byteIDs))]
				case 1:
					ids[i] = int32(r.IntN(tok.VocabSize()))
				default:
					ids[i] = int32(r.IntN(tok.VocabSize()+10)) - 5 // out-of-range ids are skipped
				}
			}
			if got, want := streamAll(t, tok, ids), tok.Decode(ids); got != want {
				t.Fatalf("%s ids %v: streamed %q, Decode %q", name, ids, got, want)
			}
		}
	}
}

// unicodeCorpus covers scripts, combining sequences, emoji ZWJ sequences, control characters
// and whitespace variety.
var unicodeCorpus = []string{
	"Hello, world!",
	"Ünïcödé façade — naïve café, Ångström, ﬁ ligature, ẞ",
	"e\u0301 a\u0308 n\u0303 (decomposed accents)",
	"日本語のテキストと漢字、ひらがな、カタカナ。",
	"中文：你好，世界！繁體字測試。",
	"한국어 문장입니다. 조합형 ᄒᆞᆫ글",
	"العربية: مرحبا بالعالم ١٢٣",
	"עברית: שלום עולם",
	"हिन्दी: नमस्ते दुनिया",
	"ไทย: สวัสดีชาวโลก",
	"Ελληνικά: Γειά σου Κόσμε",
	"Русский: Привет, мир! Ёё",
	"Emoji: 😀😃😄 👩‍👩‍👧‍👦 🇯🇵 👍🏽 ❤️",
	"Math: ∀x∈ℝ, ∑ᵢ xᵢ² ≤ ∞; ½ ⅓ ¼",
	"Tabs\tand\vvertical\ffeeds\r\nCRLF\u2028LS\u2029PS\u0085NEL",
	"\u00a0non-breaking\u3000ideographic\u2003em",
	"Zero\u200bwidth\u200djoiner\ufeffBOM",
	"Private use \ue000 and astral 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𓀀",
	"Control \x01\x02\x1b[0m and DEL \x7f",
	"<|endoftext|><|im_start|>mixed<|im_end|> specials",
	"It'S 'll 'VE 'ſ long s",
	"    deeply\n\n\n   indented\n\t\tcode();   ",
}

func TestRoundTripUnicodeCorpus(t *testing.T) {
	for _, name := range []string{"gpt2", "qwen3"} {
		tok := fixtureTokenizer(t, name)
		for _, s := range unicodeCorpus {
			want := s
			if name == "qwen3" {
				want = norm.NFC.String(s)
			}
			ids := tok.Encode(s)
			if got := tok.Decode(ids); got != want {
				t.Errorf("%s: Decode(Encode(%q)) = %q", name, s, got)
			}
			if got := streamAll(t, tok, ids); got != want {
				t.Errorf("%s: streamed Encode(%q) = %q", name, s, got)
			}
		}
	}
}

// TestStreamDecoderAddBytes checks that the byte form streams the text Decode gives for the
// whole sequence and, once its buffers have grown, allocates nothing per token (it is the
// frontend's per-token path).
func TestStreamDecoderAddBytes(t *testing.T) {
	tok := fixtureTokenizer(t, "qwen3")
	ids := tok.Encode(strings.Join(unicodeCorpus, "\n"))
	d := tok.NewStreamDecoder()
	var got []byte
	for _, id := range ids {
		got = append(got, d.AddBytes(id)...)
	}
	got = append(got, d.Flush()...)
	if want := tok.Decode(ids); string(got) != want {
		t.Fatalf("AddBytes streamed %q, Decode %q", got, want)
	}
	i := 0
	if allocs := testing.AllocsPerRun(1000, func() {
		d.AddBytes(ids[i%len(ids)])
		i++
	}); allocs != 0 {
		t.Errorf("AddBytes allocates %v times per token, want 0", allocs)
	}
}
