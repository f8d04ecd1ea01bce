package tokenizer

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"unicode/utf8"
)

// bpeModel is tokenizers' BPE model without dropout and subword affixes: merges with ranks,
// optional ignore_merges, optional unk token (fused or not), and either byte-level symbols or
// SentencePiece-style characters with byte_fallback.
type bpeModel struct {
	vocab     map[string]int32
	idToToken []string
	// merges maps a pair of ids (left<<32 | right) to rank<<32 | merged id.
	merges       map[uint64]uint64
	ignoreMerges bool
	unkID        int32 // -1: none; unknown characters are then dropped, as tokenizers does
	fuseUnk      bool

	// byteFallback: a character missing from the vocabulary becomes the <0xXX> tokens of its
	// UTF-8 bytes (fallbackIDs; -1 when the vocab lacks one, and then the character is unknown).
	byteFallback bool
	fallbackIDs  [256]int32

	// byteLevel: words arrive as raw bytes and each byte's initial symbol is the vocab id of
	// its ByteLevel character (byteIDs; -1 when the vocab lacks it).
	byteLevel bool
	byteIDs   [256]int32

	// suffix is model.end_of_word_suffix (CLIP's "</w>"): the last character of every word is
	// looked up with it appended, as tokenizers' merge_word does; byteSuffixIDs holds those
	// ids for byte-level words (-1 when the vocab lacks one).
	suffix        string
	byteSuffixIDs [256]int32

	cache wordCache
}

func (m *bpeModel) tokens() []string { return m.idToToken }

func (m *bpeModel) tokenID(tok string) (int32, bool) {
	id, ok := m.vocab[tok]
	return id, ok
}

func newBPEModel(vocab map[string]int32, idToToken []string, ignoreMerges bool) *bpeModel {
	m := &bpeModel{vocab: vocab, idToToken: idToToken, ignoreMerges: ignoreMerges, unkID: -1}
	m.cache.init()
	return m
}

// mergeRule is one resolved merges entry: left id, right id, merged id.
type mergeRule struct{ a, b, merged int32 }

// resolveMerge looks up one merges entry in the vocabulary. a and b may alias scratch
// buffers; the map lookups convert them without allocating, and buf is scratch for the
// concatenation.
//
// guess is a candidate id for the merged token: trained BPE vocabularies number merged tokens
// in merge order, so checking idToToken[guess] first (a sequential, cache-friendly compare)
// spares a third of the random map lookups of a 150k-merge load.
func resolveMerge(vocab map[string]int32, idToToken []string, guess int, a, b []byte, buf *[]byte) (mergeRule, error) {
	ia, ok := vocab[string(a)]
	if !ok {
		return mergeRule{}, fmt.Errorf("merge token %q is not in model.vocab", a)
	}
	ib, ok := vocab[string(b)]
	if !ok {
		return mergeRule{}, fmt.Errorf("merge token %q is not in model.vocab", b)
	}
	*buf = append(append((*buf)[:0], a...), b...)
	if guess >= 0 && guess < len(idToToken) && idToToken[guess] == string(*buf) {
		return mergeRule{ia, ib, int32(guess)}, nil
	}
	im, ok := vocab[string(*buf)]
	if !ok {
		return mergeRule{}, fmt.Errorf("merged token %q (from %q + %q) is not in model.vocab", *buf, a, b)
	}
	return mergeRule{ia, ib, im}, nil
}

// setMerges builds the pair table; rank is the position in tokenizer.json. When a pair is
// listed twice the later rank wins, as tokenizers' HashMap collection does.
func (m *bpeModel) setMerges(rules []mergeRule) {
	m.merges = make(map[uint64]uint64, len(rules))
	for rank, r := range rules {
		m.merges[uint64(uint32(r.a))<<32|uint64(uint32(r.b))] = uint64(uint32(rank))<<32 | uint64(uint32(r.merged))
	}
}

func (m *bpeModel) initByteIDs() error {
	for b := 0; b < 256; b++ {
		id, ok := m.vocab[string(byteToRune[b])]
		if !ok {
			id = -1
		}
		m.byteIDs[b] = id
		if m.suffix != "" {
			sid, ok := m.vocab[string(byteToRune[b])+m.suffix]
			if !ok {
				sid = -1
			}
			m.byteSuffixIDs[b] = sid
		}
	}
	return nil
}

// lookup returns the rank and merged id of a pair, ok=false when the pair never merges.
func (m *bpeModel) lookup(a, b int32) (rank int32, merged int32, ok bool) {
	v, ok := m.merges[uint64(uint32(a))<<32|uint64(uint32(b))]
	return int32(v >> 32), int32(uint32(v)), ok
}

// maxCachedWord bounds which words enter the cache: long pieces (minified code, base64) are
// rare repeats and would crowd out the common words.
const maxCachedWord = 64

// tokenizeWord appends the ids of one pre-tokenized word to out.
func (m *bpeModel) tokenizeWord(word string, out []int32) []int32 {
	return m.cache.tokenize(word, out, m.mergeWord)
}

func (m *bpeModel) mergeWord(word string, out []int32) []int32 {
	if m.ignoreMerges {
		key := word
		if m.byteLevel {
			key = byteLevelString(word)
		}
		if id, ok := m.vocab[key]; ok {
			return append(out, id)
		}
	}
	var stack [64]int32
	syms := stack[:0]
	if m.byteLevel {
		prevUnk := false
		for i := 0; i < len(word); i++ {
			id := m.byteIDs[word[i]]
			if m.suffix != "" && i == len(word)-1 {
				id = m.byteSuffixIDs[word[i]]
			}
			known := id >= 0
			if !known {
				if m.unkID < 0 || (m.fuseUnk && prevUnk) {
					continue
				}
				id = m.unkID
			}
			prevUnk = !known
			syms = append(syms, id)
		}
	} else {
		syms = m.charSymbols(word, syms)
	}
	if len(syms) < 2 {
		return append(out, syms...)
	}
	if len(syms) <= 128 {
		syms = m.mergeSmall(syms)
	} else {
		syms = m.mergeHeap(syms)
	}
	return append(out, syms...)
}

// charSymbols is tokenizers' BPE merge_word before merging, for character models: each
// character's vocab id; else, with byte_fallback, the ids of its <0xXX> byte tokens; else the
// unk token, held back while unknown characters follow so that fuse_unk can join them (and, as
// in tokenizers, byte-fallback characters in between do not release it).
func (m *bpeModel) charSymbols(word string, syms []int32) []int32 {
	pendingUnk := false
	for i := 0; i < len(word); {
		_, n := utf8.DecodeRuneInString(word[i:])
		ch := word[i : i+n]
		i += n
		if m.suffix != "" && i == len(word) {
			ch += m.suffix
		}
		if id, ok := m.vocab[ch]; ok {
			if pendingUnk {
				syms = append(syms, m.unkID)
				pendingUnk = false
			}
			syms = append(syms, id)
			continue
		}
		if m.byteFallback && m.fallbackAll(ch) {
			for j := 0; j < len(ch); j++ {
				syms = append(syms, m.fallbackIDs[ch[j]])
			}
			continue
		}
		if m.unkID < 0 {
			continue
		}
		if pendingUnk && !m.fuseUnk {
			syms = append(syms, m.unkID)
		}
		pendingUnk = true
	}
	if pendingUnk {
		syms = append(syms, m.unkID)
	}
	return syms
}

func (m *bpeModel) fallbackAll(ch string) bool {
	for j := 0; j < len(ch); j++ {
		if m.fallbackIDs[ch[j]] < 0 {
			return false
		}
	}
	return true
}

// byteFallbackToken is the vocabulary entry of one byte in byte_fallback models ("<0x0A>").
func byteFallbackToken(b byte) string {
	const hex = "0123456789ABCDEF"
	return string([]byte{'<', '0', 'x', hex[b>>4], hex[b&15], '>'})
}

// byteFallbackValue parses a "<0xXX>" token as tokenizers' ByteFallback decoder does (six
// bytes, hex digits of either case).
func byteFallbackValue(tok string) (byte, bool) {
	if len(tok) != 6 || tok[:3] != "<0x" || tok[5] != '>' {
		return 0, false
	}
	hi, ok1 := hexDigit(tok[3])
	lo, ok2 := hexDigit(tok[4])
	return hi<<4 | lo, ok1 && ok2
}

func hexDigit(c byte) (byte, bool) {
	switch {
	case c >= '0' && c <= '9':
		return c - '0', true
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10, true
	case c >= 'A' && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}

const noMerge = int32(1<<31 - 1)

// mergeSmall applies merges lowest rank first, leftmost first on ties — the order tokenizers'
// priority queue produces — keeping the rank of every adjacent pair in an array so each merge
// costs two map lookups and one scan.
func (m *bpeModel) mergeSmall(syms []int32) []int32 {
	var rstack [128]int32
	var mstack [128]int32
	ranks := rstack[:len(syms)-1]
	merged := mstack[:len(syms)-1]
	for i := range ranks {
		r, id, ok := m.lookup(syms[i], syms[i+1])
		if !ok {
			r = noMerge
		}
		ranks[i], merged[i] = r, id
	}
	for {
		best := -1
		bestRank := noMerge
		for i, r := range ranks {
			if r < bestRank {
				best, bestRank = i, r
			}
		}
		if best < 0 {
			return syms
		}
		syms[best] = merged[best]
		syms = append(syms[:best+1], syms[best+2:]...)
		ranks = append(ranks[:best], ranks[best+1:]...)
		merged = append(merged[:best], merged[best+1:]...)
		if best > 0 {
			r, id, ok := m.lookup(syms[best-1], syms[best])
			if !ok {
				r = noMerge
			}
			ranks[best-1], merged[best-1] = r, id
		}
		if best < len(ranks) {
			r, id, ok := m.lookup(syms[best], syms[best+1])
			if !ok {
				r = noMerge
			}
			ranks[best], merged[best] = r, id
		}
	}
}

// mergeHeap is tokenizers' own algorithm (word.rs merge_all): a linked list of symbols and a
// min-heap of candidate merges ordered by (rank, position), used for long words where the
// quadratic scan of mergeSmall would be slow.
func (m *bpeModel) mergeHeap(syms []int32) []int32 {
	n := len(syms)
	prev := make([]int32, n)
	next := make([]int32, n)
	for i := range syms {
		prev[i], next[i] = int32(i-1), int32(i+1)
	}
	next[n-1] = -1
	h := candHeap(make([]mergeCand, 0, n))
	for i := 0; i+1 < n; i++ {
		if r, id, ok := m.lookup(syms[i], syms[i+1]); ok {
			h = append(h, mergeCand{rank: r, pos: int32(i), id: id})
		}
	}
	h.init()
	for len(h) > 0 {
		top := h.pop()
		pos := top.pos
		if prev[pos] == -2 || next[pos] < 0 {
			continue // removed, or last symbol
		}
		nx := next[pos]
		if _, id, ok := m.lookup(syms[pos], syms[nx]); !ok || id != top.id {
			continue // stale: one side already merged into something else
		}
		syms[pos] = top.id
		prev[nx] = -2 // removed
		next[pos] = next[nx]
		if next[nx] >= 0 {
			prev[next[nx]] = pos
		}
		if p := prev[pos]; p >= 0 {
			if r, id, ok := m.lookup(syms[p], syms[pos]); ok {
				h.push(mergeCand{rank: r, pos: p, id: id})
			}
		}
		if q := next[pos]; q >= 0 {
			if r, id, ok := m.lookup(syms[pos], syms[q]); ok {
				h.push(mergeCand{rank: r, pos: pos, id: id})
			}
		}
	}
	out := syms[:0]
	for i := int32(0); i >= 0; i = next[i] {
		out = append(out, syms[i])
	}
	return out
}

type mergeCand struct {
	rank, pos, id int32
}

func (c mergeCand) less(d mergeCand) bool {
	return c.rank < d.rank || (c.rank == d.rank && c.pos < d.pos)
}

// candHeap is a binary min-heap of merge candidates, typed to avoid container/heap's
// per-element interface boxing on words with hundreds of thousands of symbols.
type candHeap []mergeCand

func (h candHeap) init() {
	for i := len(h)/2 - 1; i >= 0; i-- {
		h.down(i)
	}
}

func (h *candHeap) push(c mergeCand) {
	*h = append(*h, c)
	s := *h
	for i := len(s) - 1; i > 0; {
		p := (i - 1) / 2
		if !s[i].less(s[p]) {
			break
		}
		s[i], s[p] = s[p], s[i]
		i = p
	}
}

func (h *candHeap) pop() mergeCand {
	s := *h
	top := s[0]
	last := len(s) - 1
	s[0] = s[last]
	*h = s[:last]
	h.down(0)
	return top
}

func (h candHeap) down(i int) {
	for {
		l := 2*i + 1
		if l >= len(h) {
			return
		}
		m := l
		if r := l + 1; r < len(h) && h[r].less(h[l]) {
			m = r
		}
		if !h[m].less(h[i]) {
			return
		}
		h[i], h[m] = h[m], h[i]
		i = m
	}
}

// wordCache is a bounded word → ids cache shared by all goroutines. Reads are lock-free
// (sync.Map), so concurrent encodes on several cores do not contend on a lock's cache line
// for every word. When it reaches its bound it is dropped wholesale rather than evicted entry
// by entry: simple, and a server's working set refills it within a few requests.
type wordCache struct {
	m sync.Map // string -> []int32
	n atomic.Int64
}

const cacheMaxEntries = 1 << 16

func (c *wordCache) init() {
	c.m.Clear()
	c.n.Store(0)
}

// tokenize appends the ids of word: from the cache, or from f (then cached when the word is
// short enough to be worth keeping).
func (c *wordCache) tokenize(word string, out []int32, f func(string, []int32) []int32) []int32 {
	if len(word) <= maxCachedWord {
		if ids, ok := c.get(word); ok {
			return append(out, ids...)
		}
	}
	start := len(out)
	out = f(word, out)
	if len(word) <= maxCachedWord {
		c.put(word, out[start:])
	}
	return out
}

func (c *wordCache) get(word string) ([]int32, bool) {
	v, ok := c.m.Load(word)
	if !ok {
		return nil, false
	}
	return v.([]int32), true
}

func (c *wordCache) put(word string, ids []int32) {
	if c.n.Add(1) > cacheMaxEntries {
		c.init()
	}
	c.m.Store(strings.Clone(word), slices.Clone(ids))
}
