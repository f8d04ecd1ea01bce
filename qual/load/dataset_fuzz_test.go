package load

import (
	"os"
	"path/filepath"
	"testing"
)

// FuzzReadDataset: any input file of any type is read or refused with an error, never a
// panic; a dataset read has sessions with turns, each with text, and timestamps counted
// from the first when the file is timed.
func FuzzReadDataset(f *testing.F) {
	for _, s := range []string{
		`{"text": "hi", "timestamp": 10, "output_length": 3}`,
		`{"session_id": "a", "turns": [{"text": "x"}, {"text": "y", "delay": 5}]}`,
		`{"timestamp": 1000, "input_length": 40, "output_length": 2, "hash_ids": [1, 2]}`,
		`{"texts": ["a", "b"], "delay": -1}`,
		`{"timestamp": 5, "text_input": "abc", "output_length": 1, "session_id": "s"}` + "\n" + `{"timestamp": 9, "text_input": "d", "session_id": "s"}`,
	} {
		for i := range DatasetTypes {
			f.Add(s, uint8(i))
		}
	}
	tok := gpt2Tok(f)
	f.Fuzz(func(t *testing.T, content string, kind uint8) {
		typ := DatasetTypes[int(kind)%len(DatasetTypes)]
		p := filepath.Join(t.TempDir(), "in.jsonl")
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		ds, err := ReadDataset(p, typ, tok)
		if err != nil {
			return
		}
		for _, s := range ds.Sessions {
			if len(s.Turns) == 0 {
				t.Fatalf("session %q without turns", s.ID)
			}
			for _, turn := range s.Turns {
				if ds.Timed && (turn.TimestampMs == nil || *turn.TimestampMs < 0) {
					t.Fatalf("timed dataset with turn timestamp %v", turn.TimestampMs)
				}
			}
		}
	})
}
