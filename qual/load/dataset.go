package load

import (
	"bufio"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"sort"
	"strconv"
	"strings"
)

// AIPerf's custom dataset types (--custom-dataset-type), so its users' input files and
// commands carry over.
const (
	DatasetSingleTurn    = "single_turn"
	DatasetMultiTurn     = "multi_turn"
	DatasetRandomPool    = "random_pool"
	DatasetMooncakeTrace = "mooncake_trace"
)

// DatasetTypes lists the accepted --custom-dataset-type values.
var DatasetTypes = []string{DatasetSingleTurn, DatasetMultiTurn, DatasetRandomPool, DatasetMooncakeTrace}

// mooncakeBlockTokens is the tokens one hash_ids entry stands for in a Mooncake trace
// (AIPerf's --isl-block-size default): equal hash IDs are equal blocks, so prefixes that
// the trace shares are shared in the replay too (what a server's prefix cache sees).
const mooncakeBlockTokens = 512

// Turn is one request of a session.
type Turn struct {
	Prompt Prompt
	// TimestampMs, when set, is when the turn is sent, in ms from the trace's first
	// timestamp (--fixed-schedule).
	TimestampMs *float64
	// DelayMs is how long to wait after the previous turn of the session ended (or, for the
	// first turn of a single_turn line, after the previous line was sent).
	DelayMs float64
}

// Session is a conversation: its turns are sent one after another, each carrying the
// history before it (chat: the earlier messages and the answers; completions: the earlier
// prompts and answers prepended).
type Session struct {
	ID    string
	Turns []Turn
}

// Dataset is an input file read as one of AIPerf's custom dataset types.
type Dataset struct {
	Type     string
	Sessions []Session
	// Timed says every turn has a timestamp (a trace a fixed schedule can replay).
	Timed bool
}

// turnLine is one single_turn / random_pool line or one turn of a multi_turn line (AIPerf's
// field names: text or texts, timestamp and delay in ms, output_length, role, extra).
type turnLine struct {
	Text         *string         `json:"text"`
	Texts        []string        `json:"texts"`
	Timestamp    *float64        `json:"timestamp"`
	Delay        *float64        `json:"delay"`
	OutputLength int             `json:"output_length"`
	Role         string          `json:"role"`
	SessionID    string          `json:"session_id"`
	Extra        json.RawMessage `json:"extra"`
	// mooncake_trace
	InputLength *int       `json:"input_length"`
	HashIDs     []int      `json:"hash_ids"`
	TextInput   *string    `json:"text_input"`
	Turns       []turnLine `json:"turns"`
}

// ReadDataset reads an AIPerf custom dataset file of the given type. tok counts input tokens
// and, for mooncake_trace, makes each prompt of exactly input_length tokens from its hash_ids
// blocks (tok is required then). Errors name the file, the line and the field.
func ReadDataset(path, typ string, tok Tokenizer) (*Dataset, error) {
	switch typ {
	case DatasetSingleTurn, DatasetMultiTurn, DatasetRandomPool, DatasetMooncakeTrace:
	default:
		return nil, fmt.Errorf("--custom-dataset-type %q: want one of %s", typ, strings.Join(DatasetTypes, ", "))
	}
	if typ == DatasetMooncakeTrace && tok == nil {
		return nil, fmt.Errorf("mooncake_trace %s: prompts are made from input_length tokens, which needs a tokenizer (--tokenizer)", path)
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("read input file: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 1<<16), 64<<20)
	ds := &Dataset{Type: typ, Timed: true}
	bySession := map[string]int{}
	blocks := map[int]string{}
	line := 0
	for sc.Scan() {
		line++
		b := strings.TrimSpace(sc.Text())
		if b == "" {
			continue
		}
		var l turnLine
		if err := json.Unmarshal([]byte(b), &l); err != nil {
			return nil, fmt.Errorf("%s %s line %d: %v", typ, path, line, err)
		}
		where := fmt.Sprintf("%s %s line %d", typ, path, line)
		var turns []Turn
		switch typ {
		case DatasetMultiTurn:
			if len(l.Turns) == 0 {
				return nil, fmt.Errorf("%s: no \"turns\"; a multi_turn line is {\"session_id\": ..., \"turns\": [{\"text\": ...}, ...]}", where)
			}
			for k := range l.Turns {
				t, err := textTurn(&l.Turns[k], fmt.Sprintf("%s turn %d", where, k), tok)
				if err != nil {
					return nil, err
				}
				turns = append(turns, t)
			}
		case DatasetMooncakeTrace:
			t, err := mooncakeTurn(&l, where, tok, blocks)
			if err != nil {
				return nil, err
			}
			turns = []Turn{t}
		default:
			t, err := textTurn(&l, where, tok)
			if err != nil {
				return nil, err
			}
			turns = []Turn{t}
		}
		for _, t := range turns {
			ds.Timed = ds.Timed && t.TimestampMs != nil
		}
		id := l.SessionID
		if id == "" || typ == DatasetSingleTurn || typ == DatasetRandomPool {
			id = "line-" + strconv.Itoa(line)
		}
		if i, ok := bySession[id]; ok && typ == DatasetMooncakeTrace {
			// A Mooncake trace's session_id groups its lines into one conversation.
			ds.Sessions[i].Turns = append(ds.Sessions[i].Turns, turns...)
			continue
		}
		bySession[id] = len(ds.Sessions)
		ds.Sessions = append(ds.Sessions, Session{ID: id, Turns: turns})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read input file %s: %w", path, err)
	}
	if len(ds.Sessions) == 0 {
		return nil, fmt.Errorf("input file %s holds no %s entries", path, typ)
	}
	if typ == DatasetRandomPool {
		ds.Timed = false
	}
	if ds.Timed {
		// Timestamps count from the trace's first one (AIPerf's auto offset).
		t0 := math.Inf(1)
		for _, s := range ds.Sessions {
			for _, t := range s.Turns {
				t0 = math.Min(t0, *t.TimestampMs)
			}
		}
		for si := range ds.Sessions {
			for ti := range ds.Sessions[si].Turns {
				v := *ds.Sessions[si].Turns[ti].TimestampMs - t0
				ds.Sessions[si].Turns[ti].TimestampMs = &v
			}
		}
		sort.SliceStable(ds.Sessions, func(i, j int) bool {
			return *ds.Sessions[i].Turns[0].TimestampMs < *ds.Sessions[j].Turns[0].TimestampMs
		})
	}
	return ds, nil
}

func textTurn(l *turnLine, where string, tok Tokenizer) (Turn, error) {
	text := ""
	switch {
	case l.Text != nil:
		text = *l.Text
	case len(l.Texts) > 0:
		text = strings.Join(l.Texts, "\n")
	default:
		return Turn{}, fmt.Errorf("%s: no \"text\" (or \"texts\")", where)
	}
	if l.OutputLength < 0 {
		return Turn{}, fmt.Errorf("%s: output_length %d is negative", where, l.OutputLength)
	}
	if l.Delay != nil && *l.Delay < 0 {
		return Turn{}, fmt.Errorf("%s: delay %v ms is negative", where, *l.Delay)
	}
	t := Turn{Prompt: Prompt{Name: where, Prompt: text, OutputTokens: l.OutputLength}, TimestampMs: l.Timestamp}
	if l.Delay != nil {
		t.DelayMs = *l.Delay
	}
	if tok != nil {
		t.Prompt.InputTokens = len(tok.Encode(text))
	}
	return t, nil
}

// mooncakeTurn makes a Mooncake trace line's prompt: text_input when given, else one text
// block per hash ID (the same ID, the same block) cut to input_length tokens.
func mooncakeTurn(l *turnLine, where string, tok Tokenizer, blocks map[int]string) (Turn, error) {
	if l.Timestamp == nil && l.Delay == nil {
		return Turn{}, fmt.Errorf("%s: no \"timestamp\" (ms) or \"delay\"; a mooncake_trace line is {\"timestamp\": ms, \"input_length\": n, \"output_length\": m, \"hash_ids\": [...]}", where)
	}
	if l.OutputLength < 0 {
		return Turn{}, fmt.Errorf("%s: output_length %d is negative", where, l.OutputLength)
	}
	t := Turn{TimestampMs: l.Timestamp}
	if l.Delay != nil {
		t.DelayMs = *l.Delay
	}
	var text string
	switch {
	case l.TextInput != nil:
		text = *l.TextInput
	case l.InputLength == nil || *l.InputLength < 1:
		return Turn{}, fmt.Errorf("%s: input_length must be a positive token count (or give text_input)", where)
	default:
		n := *l.InputLength
		ids := l.HashIDs
		need := (n + mooncakeBlockTokens - 1) / mooncakeBlockTokens
		if len(ids) < need {
			// Blocks the trace does not name are this line's own.
			for k := len(ids); k < need; k++ {
				ids = append(ids, -1-len(blocks)-k)
			}
		}
		var toks []int32
		for _, id := range ids[:need] {
			b, ok := blocks[id]
			if !ok {
				b = synthBlock(tok, id)
				blocks[id] = b
			}
			toks = append(toks, tok.Encode(b)...)
		}
		if len(toks) > n {
			toks = toks[:n]
		}
		text = tok.Decode(toks)
	}
	t.Prompt = Prompt{Name: where, Prompt: text, OutputTokens: l.OutputLength, InputTokens: len(tok.Encode(text))}
	return t, nil
}

// synthBlock is the text of one Mooncake block: mooncakeBlockTokens or more tokens of the
// built-in corpus, starting at a place drawn from the hash ID, so equal IDs give equal text.
func synthBlock(tok Tokenizer, id int) string {
	words := strings.Fields(sourceText)
	rng := rand.New(rand.NewPCG(uint64(int64(id)), 0x6d6f6f6e))
	var b strings.Builder
	i := rng.IntN(len(words))
	for n := 0; n < mooncakeBlockTokens*2; n++ {
		b.WriteString(words[(i+n)%len(words)])
		b.WriteByte(' ')
	}
	s := b.String()
	toks := tok.Encode(s)
	if len(toks) > mooncakeBlockTokens {
		toks = toks[:mooncakeBlockTokens]
	}
	return tok.Decode(toks)
}

// SampleSessions draws n sessions from a random_pool dataset with replacement (the seed
// fixes the draw); other types are returned as they are.
func (d *Dataset) SampleSessions(n int, seed uint64) []Session {
	if d.Type != DatasetRandomPool || n <= 0 {
		return d.Sessions
	}
	rng := rand.New(rand.NewPCG(seed, 0x706f6f6c))
	out := make([]Session, n)
	for i := range out {
		s := d.Sessions[rng.IntN(len(d.Sessions))]
		out[i] = Session{ID: fmt.Sprintf("%s#%d", s.ID, i), Turns: s.Turns}
	}
	return out
}
