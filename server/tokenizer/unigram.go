package tokenizer

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"unicode/utf8"
)

// model is a tokenizers model: it turns one pre-tokenized word into ids.
type tokenModel interface {
	tokenizeWord(word string, out []int32) []int32
	// tokens is the id → token table of the model vocabulary ("" for holes).
	tokens() []string
	tokenID(tok string) (int32, bool)
}

// unkPenalty is tokenizers' K_UNK_PENALTY: an unknown character scores this much below the
// lowest piece, so the best path uses it only where no piece covers the character.
const unkPenalty = 10.0

// unigramModel is tokenizers' Unigram model (models/unigram/model.rs, encode_optimized): the
// Viterbi best segmentation of a word over the pieces' log-probability scores, unknown
// characters fused into one unk token, and with byte_fallback an unknown run spelled as its
// <0xXX> byte pieces instead.
type unigramModel struct {
	pieces       []string
	scores       []float64
	vocab        map[string]int32
	trie         pieceTrie
	unkID        int32 // -1: none
	unkScore     float64
	byteFallback bool
	cache        wordCache
}

func newUnigramModel(raw []byte, opts modelOptions) (*unigramModel, error) {
	var entries [][2]json.RawMessage
	if err := json.Unmarshal(raw, &entries); err != nil {
		return nil, fmt.Errorf("tokenizer.json: model.vocab of a Unigram model must be [[\"piece\", score], ...]: %w", err)
	}
	if len(entries) >= 1<<24 {
		return nil, fmt.Errorf("tokenizer.json: model.vocab has %d pieces, implausibly many (over 16M); the file is corrupt", len(entries))
	}
	m := &unigramModel{
		pieces: make([]string, len(entries)),
		scores: make([]float64, len(entries)),
		vocab:  make(map[string]int32, len(entries)),
		unkID:  -1,
	}
	minScore := math.Inf(1)
	for i, e := range entries {
		if err := json.Unmarshal(e[0], &m.pieces[i]); err != nil {
			return nil, fmt.Errorf("tokenizer.json: model.vocab[%d]: piece: %w", i, err)
		}
		if err := json.Unmarshal(e[1], &m.scores[i]); err != nil {
			return nil, fmt.Errorf("tokenizer.json: model.vocab[%d] (%q): score: %w", i, m.pieces[i], err)
		}
		// Later duplicates win, as tokenizers' token_to_ids HashMap insertion does.
		m.vocab[m.pieces[i]] = int32(i)
		m.trie.insert(m.pieces[i], int32(i))
		minScore = min(minScore, m.scores[i])
	}
	if opts.UnkID != nil {
		if len(entries) == 0 {
			return nil, errors.New("tokenizer.json: model.unk_id is set but the Unigram vocabulary is empty")
		}
		if *opts.UnkID < 0 || *opts.UnkID >= len(entries) {
			return nil, fmt.Errorf("tokenizer.json: model.unk_id %d is outside the vocabulary (0..%d)", *opts.UnkID, len(entries)-1)
		}
		m.unkID = int32(*opts.UnkID)
	}
	if opts.Dropout != nil && *opts.Dropout != 0 {
		return nil, fmt.Errorf("tokenizer.json: model.dropout %v is not supported (inference tokenizers use none)", *opts.Dropout)
	}
	m.unkScore = minScore - unkPenalty
	m.byteFallback = opts.ByteFallback
	m.cache.init()
	return m, nil
}

func (m *unigramModel) tokens() []string { return m.pieces }

func (m *unigramModel) tokenID(tok string) (int32, bool) {
	id, ok := m.vocab[tok]
	return id, ok
}

func (m *unigramModel) tokenizeWord(word string, out []int32) []int32 {
	if word == "" {
		return out
	}
	return m.cache.tokenize(word, out, m.viterbi)
}

// pathNode is the best path ending at one byte offset: its last piece and where that piece
// starts (-1: no path reaches this offset yet).
type pathNode struct {
	id     int32
	score  float64
	starts int
}

// viterbi is encode_optimized followed by tokenize: candidates at each character start are
// the pieces that prefix the rest of the word, shortest first; a candidate replaces the best
// path at its end only with a strictly higher score, so ties keep the earlier one.
func (m *unigramModel) viterbi(word string, out []int32) []int32 {
	n := len(word)
	best := make([]pathNode, n+1)
	for i := range best {
		best[i].starts = -1
	}
	for pos := 0; pos < n; {
		_, mblen := utf8.DecodeRuneInString(word[pos:])
		here := best[pos].score
		single := false
		m.trie.prefixes(word[pos:], func(length int, id int32) {
			end := pos + length
			cand := here + m.scores[id]
			if t := &best[end]; t.starts < 0 || cand > t.score {
				*t = pathNode{id: id, score: cand, starts: pos}
			}
			if length == mblen {
				single = true
			}
		})
		if !single && m.unkID >= 0 {
			cand := here + m.unkScore
			if t := &best[pos+mblen]; t.starts < 0 || cand > t.score {
				*t = pathNode{id: m.unkID, score: cand, starts: pos}
			}
		}
		pos += mblen
	}
	// Walk back; runs of unk pieces become one fused piece (their text joined).
	type seg struct {
		start, end int
		id         int32
	}
	var segs []seg
	for end := n; end > 0; {
		node := best[end]
		if node.starts < 0 {
			// No path: only possible without an unk token. tokenizers fails the encode
			// (MissingUnkId); this character is dropped instead, as BPE drops unknowns.
			_, w := utf8.DecodeLastRuneInString(word[:end])
			end -= w
			continue
		}
		if node.id == m.unkID && len(segs) > 0 && segs[len(segs)-1].id == m.unkID && segs[len(segs)-1].start == end {
			segs[len(segs)-1].start = node.starts
		} else {
			segs = append(segs, seg{node.starts, end, node.id})
		}
		end = node.starts
	}
	for i := len(segs) - 1; i >= 0; i-- {
		g := segs[i]
		if g.id != m.unkID {
			out = append(out, g.id)
			continue
		}
		text := word[g.start:g.end]
		if id, ok := m.vocab[text]; ok {
			out = append(out, id)
			continue
		}
		if m.byteFallback {
			if ids, ok := m.fallbackBytes(text); ok {
				out = append(out, ids...)
				continue
			}
		}
		out = append(out, m.unkID)
	}
	return out
}

func (m *unigramModel) fallbackBytes(text string) ([]int32, bool) {
	ids := make([]int32, len(text))
	for i := 0; i < len(text); i++ {
		id, ok := m.vocab[byteFallbackToken(text[i])]
		if !ok {
			return nil, false
		}
		ids[i] = id
	}
	return ids, true
}

// pieceTrie is a byte trie over the pieces, for the common-prefix search of each position.
type pieceTrie struct {
	nodes []trieNode
}

type trieNode struct {
	next map[byte]int32
	id   int32 // piece ending here; -1 none
}

func (t *pieceTrie) insert(piece string, id int32) {
	if len(t.nodes) == 0 {
		t.nodes = append(t.nodes, trieNode{id: -1})
	}
	cur := int32(0)
	for i := 0; i < len(piece); i++ {
		nx, ok := t.nodes[cur].next[piece[i]]
		if !ok {
			nx = int32(len(t.nodes))
			t.nodes = append(t.nodes, trieNode{id: -1})
			if t.nodes[cur].next == nil {
				t.nodes[cur].next = map[byte]int32{}
			}
			t.nodes[cur].next[piece[i]] = nx
		}
		cur = nx
	}
	t.nodes[cur].id = id
}

// prefixes calls fn for every piece that is a prefix of s, shortest first.
func (t *pieceTrie) prefixes(s string, fn func(length int, id int32)) {
	if len(t.nodes) == 0 {
		return
	}
	cur := int32(0)
	for i := 0; i < len(s); i++ {
		nx, ok := t.nodes[cur].next[s[i]]
		if !ok {
			return
		}
		cur = nx
		if id := t.nodes[cur].id; id >= 0 {
			fn(i+1, id)
		}
	}
}
