package native

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"

	"github.com/modelqual/modelqual/native/bundle"
)

// kv is one flattened config.json value (mq_kv): Go parses the checkpoint's JSON once, and the
// family's resolve step in the runtime reads typed values by dotted key, so no family's config
// names live in Go and no JSON parser lives in C++.
type kv struct {
	key     string
	kind    int // mq_kv_type
	number  float64
	str     string
	numbers []float64
	strs    []string
}

// mq_kv_type values (modelqual.h).
const (
	kvNull = iota
	kvNumber
	kvBool
	kvString
	kvNumbers
	kvStrings
)

// flattenConfig turns a JSON object into dotted keys: {"a": {"b": 1}} gives a.b = 1. Lists of
// numbers or of strings are kept as lists; lists of anything else (objects, mixed) are skipped,
// since no family reads them through the runtime (they stay in the bundle's config section).
func flattenConfig(raw json.RawMessage) ([]kv, error) {
	var root map[string]any
	if err := json.Unmarshal(raw, &root); err != nil || root == nil {
		return nil, fmt.Errorf("config.json is not a JSON object")
	}
	var out []kv
	var walk func(prefix string, v any)
	walk = func(prefix string, v any) {
		switch x := v.(type) {
		case nil:
			out = append(out, kv{key: prefix, kind: kvNull})
		case bool:
			n := 0.0
			if x {
				n = 1
			}
			out = append(out, kv{key: prefix, kind: kvBool, number: n})
		case float64:
			out = append(out, kv{key: prefix, kind: kvNumber, number: x})
		case string:
			out = append(out, kv{key: prefix, kind: kvString, str: x})
		case map[string]any:
			keys := make([]string, 0, len(x))
			for k := range x {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			for _, k := range keys {
				walk(prefix+"."+k, x[k])
			}
		case []any:
			nums, strs := make([]float64, 0, len(x)), make([]string, 0, len(x))
			for _, e := range x {
				switch y := e.(type) {
				case float64:
					nums = append(nums, y)
				case string:
					strs = append(strs, y)
				}
			}
			switch {
			case len(nums) == len(x):
				out = append(out, kv{key: prefix, kind: kvNumbers, numbers: nums})
			case len(strs) == len(x):
				out = append(out, kv{key: prefix, kind: kvStrings, strs: strs})
			}
		}
	}
	keys := make([]string, 0, len(root))
	for k := range root {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		walk(k, root[k])
	}
	for i := range out {
		out[i].key = strings.TrimPrefix(out[i].key, ".")
	}
	return out, nil
}

// eosIDs reads the end-of-sequence ids as transformers' generate does: generation_config.json's
// eos_token_id wins over config.json's; an integer or a list; ids outside the vocabulary (the
// mock's -1, "no EOS") are dropped.
func eosIDs(h *bundle.Header, vocab int) ([]int32, error) {
	var g, c struct {
		EOSTokenID json.RawMessage `json:"eos_token_id"`
	}
	if len(h.GenerationConfig) > 0 {
		if err := json.Unmarshal(h.GenerationConfig, &g); err != nil {
			return nil, fmt.Errorf("generation_config.json: %v", err)
		}
	}
	if err := json.Unmarshal(h.Config, &c); err != nil {
		return nil, fmt.Errorf("config.json: %v", err)
	}
	raw := g.EOSTokenID
	if len(raw) == 0 || string(raw) == "null" {
		raw = c.EOSTokenID
	}
	ids, err := parseIDs(raw)
	if err != nil {
		return nil, fmt.Errorf("eos_token_id: %v", err)
	}
	kept := ids[:0]
	for _, id := range ids {
		if id >= 0 && int(id) < vocab {
			kept = append(kept, id)
		}
	}
	return kept, nil
}

// parseIDs reads an eos_token_id that is absent, an integer, or a list of integers.
func parseIDs(raw json.RawMessage) ([]int32, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var one int32
	if err := json.Unmarshal(raw, &one); err == nil {
		return []int32{one}, nil
	}
	var many []int32
	if err := json.Unmarshal(raw, &many); err != nil {
		return nil, fmt.Errorf("%s is neither an integer nor a list of integers", raw)
	}
	return many, nil
}
