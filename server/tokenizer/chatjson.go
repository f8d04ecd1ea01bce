package tokenizer

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/nikolalohinski/gonja/v2/exec"
)

// toTemplateValue prepares caller data for gonja: []Message becomes []any of maps (gonja
// iterates []any and indexes maps), and json.RawMessage is decoded the way Python's json.loads
// would see it — integers as ints, other numbers as floats, and objects with their key order
// recorded in scope so tojson can write them back in that order. Everything else passes as is.
func toTemplateValue(v any, scope *renderScope) (any, error) {
	switch x := v.(type) {
	case []Message:
		out := make([]any, len(x))
		for i, m := range x {
			var err error
			if out[i], err = toTemplateValue(m, scope); err != nil {
				return nil, fmt.Errorf("messages[%d]: %w", i, err)
			}
		}
		return out, nil
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			var err error
			if out[k], err = toTemplateValue(e, scope); err != nil {
				return nil, fmt.Errorf("%s: %w", k, err)
			}
		}
		return out, nil
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			var err error
			if out[i], err = toTemplateValue(e, scope); err != nil {
				return nil, fmt.Errorf("[%d]: %w", i, err)
			}
		}
		return out, nil
	case json.RawMessage:
		return scope.decode(x)
	}
	return v, nil
}

// orderedKeys maps the identity of a map decoded from JSON during a render to the order of
// its keys in the JSON text. Go maps have no order; Python dicts keep insertion order, and
// transformers' tojson writes keys in that order. Entries live only while their render runs.
var orderedKeys sync.Map // uintptr -> []string

// renderScope tracks the maps one render registered in orderedKeys.
type renderScope struct{ maps []uintptr }

func (r *renderScope) release() {
	for _, p := range r.maps {
		orderedKeys.Delete(p)
	}
	r.maps = nil
}

// pyFloatValue is a JSON number that Python would load as a float (it had a fraction or an
// exponent), so tojson writes it as Python's float repr ("2.0", not "2").
type pyFloatValue float64

func (r *renderScope) decode(raw json.RawMessage) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	v, err := r.decodeValue(dec, 0)
	if err != nil {
		return nil, fmt.Errorf("decode JSON %s: %w", truncateForError(raw), err)
	}
	if dec.More() {
		return nil, fmt.Errorf("decode JSON %s: trailing data", truncateForError(raw))
	}
	return v, nil
}

func (r *renderScope) decodeValue(dec *json.Decoder, depth int) (any, error) {
	if depth > 200 {
		return nil, errors.New("nested deeper than 200 levels")
	}
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	switch t := tok.(type) {
	case json.Delim:
		if t == '[' {
			list := []any{}
			for dec.More() {
				v, err := r.decodeValue(dec, depth+1)
				if err != nil {
					return nil, err
				}
				list = append(list, v)
			}
			_, err := dec.Token()
			return list, err
		}
		m := map[string]any{}
		var keys []string
		for dec.More() {
			kt, err := dec.Token()
			if err != nil {
				return nil, err
			}
			k, _ := kt.(string)
			v, err := r.decodeValue(dec, depth+1)
			if err != nil {
				return nil, err
			}
			if _, dup := m[k]; !dup {
				keys = append(keys, k)
			}
			m[k] = v
		}
		if _, err := dec.Token(); err != nil {
			return nil, err
		}
		p := reflect.ValueOf(m).Pointer()
		orderedKeys.Store(p, keys)
		r.maps = append(r.maps, p)
		return m, nil
	case json.Number:
		if !strings.ContainsAny(string(t), ".eE") {
			if i, err := t.Int64(); err == nil {
				return int(i), nil
			}
		}
		f, err := t.Float64()
		return pyFloatValue(f), err
	default:
		return t, nil // string, bool or nil
	}
}

// filterPythonToJSON is transformers' tojson filter: json.dumps(x, ensure_ascii=False,
// indent=indent, separators=separators, sort_keys=sort_keys). Unlike Jinja's own tojson it
// does not HTML-escape, and it formats like Python (", " and ": " separators, non-ASCII kept).
// Go maps have no insertion order, so their keys are written sorted; gonja dict literals keep
// their order.
func filterPythonToJSON(e *exec.Evaluator, in *exec.Value, params *exec.VarArgs) *exec.Value {
	if in.IsError() {
		return in
	}
	enc := pyJSON{itemSep: ", ", keySep: ": ", indent: -1}
	if v, ok := params.KwArgs["indent"]; ok && !v.IsNil() {
		if !v.IsInteger() {
			return exec.AsValue(fmt.Errorf("tojson: indent must be an integer, got %s", v.String()))
		}
		enc.indent = v.Integer()
		enc.itemSep = ","
	}
	if len(params.Args) > 0 && params.Args[0].IsInteger() {
		enc.indent = params.Args[0].Integer()
		enc.itemSep = ","
	}
	if v, ok := params.KwArgs["separators"]; ok && !v.IsNil() {
		seps, ok := v.ToGoSimpleType(false).([]any)
		if !ok || len(seps) != 2 {
			return exec.AsValue(fmt.Errorf("tojson: separators must be a pair of strings"))
		}
		enc.itemSep, _ = seps[0].(string)
		enc.keySep, _ = seps[1].(string)
	}
	if v, ok := params.KwArgs["sort_keys"]; ok {
		enc.sortKeys = v.IsTrue()
	}
	var sb strings.Builder
	if err := enc.write(&sb, in.Interface(), 0); err != nil {
		return exec.AsValue(fmt.Errorf("tojson: %w", err))
	}
	return exec.AsSafeValue(sb.String())
}

type pyJSON struct {
	itemSep, keySep string
	indent          int // -1: none
	sortKeys        bool
}

func (p *pyJSON) newline(sb *strings.Builder, depth int) {
	if p.indent < 0 {
		return
	}
	sb.WriteByte('\n')
	sb.WriteString(strings.Repeat(" ", p.indent*depth))
}

func (p *pyJSON) write(sb *strings.Builder, v any, depth int) error {
	if depth > 100 {
		return fmt.Errorf("value nested deeper than 100 levels")
	}
	switch x := v.(type) {
	case nil:
		sb.WriteString("null")
		return nil
	case *exec.Value:
		if x == nil {
			sb.WriteString("null")
			return nil
		}
		return p.write(sb, x.Interface(), depth)
	case exec.Dict:
		return p.write(sb, &x, depth)
	case *exec.Dict:
		keys := make([]string, 0, len(x.Pairs))
		vals := map[string]any{}
		for _, pair := range x.Pairs {
			k := pair.Key.String()
			if _, dup := vals[k]; !dup {
				keys = append(keys, k)
			}
			vals[k] = pair.Value
		}
		return p.writeObject(sb, keys, vals, depth, p.sortKeys)
	case string:
		writePyString(sb, x)
		return nil
	case bool:
		if x {
			sb.WriteString("true")
		} else {
			sb.WriteString("false")
		}
		return nil
	case pyFloatValue:
		sb.WriteString(pyFloatRepr(float64(x)))
		return nil
	case float64:
		sb.WriteString(pyFloat(x))
		return nil
	case float32:
		sb.WriteString(pyFloat(float64(x)))
		return nil
	case json.Number:
		sb.WriteString(x.String())
		return nil
	}
	rv := reflect.ValueOf(v)
	switch rv.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		sb.WriteString(strconv.FormatInt(rv.Int(), 10))
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		sb.WriteString(strconv.FormatUint(rv.Uint(), 10))
	case reflect.String:
		writePyString(sb, rv.String())
	case reflect.Slice, reflect.Array:
		if rv.Len() == 0 {
			sb.WriteString("[]")
			return nil
		}
		sb.WriteByte('[')
		for i := 0; i < rv.Len(); i++ {
			if i > 0 {
				sb.WriteString(p.itemSep)
			}
			p.newline(sb, depth+1)
			if err := p.write(sb, rv.Index(i).Interface(), depth+1); err != nil {
				return err
			}
		}
		p.newline(sb, depth)
		sb.WriteByte(']')
	case reflect.Map:
		if rv.Type().Key().Kind() != reflect.String {
			return fmt.Errorf("map with %s keys is not JSON", rv.Type().Key())
		}
		vals := make(map[string]any, rv.Len())
		for _, k := range rv.MapKeys() {
			vals[k.String()] = rv.MapIndex(k).Interface()
		}
		if order, ok := orderedKeys.Load(rv.Pointer()); ok && len(order.([]string)) == len(vals) {
			return p.writeObject(sb, slices.Clone(order.([]string)), vals, depth, p.sortKeys)
		}
		keys := make([]string, 0, len(vals))
		for k := range vals {
			keys = append(keys, k)
		}
		return p.writeObject(sb, keys, vals, depth, true)
	case reflect.Pointer, reflect.Interface:
		if rv.IsNil() {
			sb.WriteString("null")
			return nil
		}
		return p.write(sb, rv.Elem().Interface(), depth)
	default:
		return fmt.Errorf("cannot serialize %T", v)
	}
	return nil
}

func (p *pyJSON) writeObject(sb *strings.Builder, keys []string, vals map[string]any, depth int, sorted bool) error {
	if len(keys) == 0 {
		sb.WriteString("{}")
		return nil
	}
	if sorted {
		sort.Strings(keys)
	}
	sb.WriteByte('{')
	for i, k := range keys {
		if i > 0 {
			sb.WriteString(p.itemSep)
		}
		p.newline(sb, depth+1)
		writePyString(sb, k)
		sb.WriteString(p.keySep)
		if err := p.write(sb, vals[k], depth+1); err != nil {
			return err
		}
	}
	p.newline(sb, depth)
	sb.WriteByte('}')
	return nil
}

// writePyString writes s as json.dumps(s, ensure_ascii=False) does.
func writePyString(sb *strings.Builder, s string) {
	sb.WriteByte('"')
	for i := 0; i < len(s); {
		c := s[i]
		if c >= utf8.RuneSelf {
			r, w := utf8.DecodeRuneInString(s[i:])
			sb.WriteRune(r) // invalid bytes become U+FFFD; Python strings cannot hold them
			i += w
			continue
		}
		switch c {
		case '"':
			sb.WriteString(`\"`)
		case '\\':
			sb.WriteString(`\\`)
		case '\n':
			sb.WriteString(`\n`)
		case '\r':
			sb.WriteString(`\r`)
		case '\t':
			sb.WriteString(`\t`)
		case '\b':
			sb.WriteString(`\b`)
		case '\f':
			sb.WriteString(`\f`)
		default:
			if c < 0x20 {
				fmt.Fprintf(sb, `\u%04x`, c)
			} else {
				sb.WriteByte(c)
			}
		}
		i++
	}
	sb.WriteByte('"')
}

// pyFloatRepr is Python's repr of a float: "2.0", "0.1", "1e-05", "1e+16".
func pyFloatRepr(f float64) string {
	if f == math.Trunc(f) && math.Abs(f) < 1e16 {
		return strconv.FormatFloat(f, 'f', 1, 64)
	}
	return pyFloat(f)
}

// pyFloat formats like Python's float repr, except that integral values (which is what JSON
// integers become after encoding/json) print as integers.
func pyFloat(f float64) string {
	switch {
	case math.IsNaN(f):
		return "NaN"
	case math.IsInf(f, 1):
		return "Infinity"
	case math.IsInf(f, -1):
		return "-Infinity"
	case f == math.Trunc(f) && math.Abs(f) < 1e16:
		return strconv.FormatInt(int64(f), 10)
	}
	// Python's repr switches to exponent notation outside 1e-4 <= |f| < 1e16.
	e := strconv.FormatFloat(f, 'e', -1, 64)
	exp, _ := strconv.Atoi(e[strings.IndexByte(e, 'e')+1:])
	if exp >= -4 && exp < 16 {
		return strconv.FormatFloat(f, 'f', -1, 64)
	}
	return e
}
