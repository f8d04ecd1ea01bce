package bundle

import (
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
)

// maxLayers bounds the layer count read from a config, so a corrupt header cannot make the
// validator enumerate billions of expected tensors.
const maxLayers = 1024

// expectedTensor is one tensor a family's forward pass reads, with its shape as derived from
// config.json.
type expectedTensor struct {
	name  string
	shape []int64
}

// familyTensors lists the tensors a family needs (required) and those it may carry (optional),
// derived from config.json. It is the single place that knows each family's weight layout, so
// both Build and ReadHeader reject a checkpoint whose tensors do not fit its config.
func familyTensors(family string, config json.RawMessage) (required, optional []expectedTensor, err error) {
	c, err := parseConfig(config)
	if err != nil {
		return nil, nil, err
	}
	switch family {
	case "mock":
		if _, err := c.positive("vocab_size"); err != nil {
			return nil, nil, err
		}
		return nil, nil, nil
	case "gpt2":
		return gpt2Tensors(c)
	case "qwen3":
		return qwen3Tensors(c)
	}
	return nil, nil, fmt.Errorf("family %q is not known (known: gpt2, qwen3, mock)", family)
}

func gpt2Tensors(c configMap) (req, opt []expectedTensor, err error) {
	d, err := c.positives("n_embd", "n_layer", "n_head", "vocab_size", "n_positions")
	if err != nil {
		return nil, nil, err
	}
	e, l, h, v, p := d[0], d[1], d[2], d[3], d[4]
	if l > maxLayers {
		return nil, nil, fmt.Errorf("config.n_layer %d exceeds %d", l, maxLayers)
	}
	if e%h != 0 {
		return nil, nil, fmt.Errorf("config.n_embd %d is not a multiple of config.n_head %d", e, h)
	}
	inner := 4 * e
	if _, ok := c["n_inner"]; ok && c["n_inner"] != nil {
		if inner, err = c.positive("n_inner"); err != nil {
			return nil, nil, err
		}
	}
	add := func(name string, shape ...int64) { req = append(req, expectedTensor{name, shape}) }
	add("wte.weight", v, e)
	add("wpe.weight", p, e)
	for i := int64(0); i < l; i++ {
		pre := fmt.Sprintf("h.%d.", i)
		add(pre+"ln_1.weight", e)
		add(pre+"ln_1.bias", e)
		add(pre+"attn.c_attn.weight", e, 3*e)
		add(pre+"attn.c_attn.bias", 3*e)
		add(pre+"attn.c_proj.weight", e, e)
		add(pre+"attn.c_proj.bias", e)
		add(pre+"ln_2.weight", e)
		add(pre+"ln_2.bias", e)
		add(pre+"mlp.c_fc.weight", e, inner)
		add(pre+"mlp.c_fc.bias", inner)
		add(pre+"mlp.c_proj.weight", inner, e)
		add(pre+"mlp.c_proj.bias", e)
	}
	add("ln_f.weight", e)
	add("ln_f.bias", e)
	opt = append(opt, expectedTensor{"lm_head.weight", []int64{v, e}})
	return req, opt, nil
}

func qwen3Tensors(c configMap) (req, opt []expectedTensor, err error) {
	d, err := c.positives("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size")
	if err != nil {
		return nil, nil, err
	}
	hs, l, nh, inter, v := d[0], d[1], d[2], d[3], d[4]
	if l > maxLayers {
		return nil, nil, fmt.Errorf("config.num_hidden_layers %d exceeds %d", l, maxLayers)
	}
	nkv := nh
	if c["num_key_value_heads"] != nil {
		if nkv, err = c.positive("num_key_value_heads"); err != nil {
			return nil, nil, err
		}
	}
	if nh%nkv != 0 {
		return nil, nil, fmt.Errorf("config.num_attention_heads %d is not a multiple of config.num_key_value_heads %d", nh, nkv)
	}
	hd := hs / nh
	if c["head_dim"] != nil {
		if hd, err = c.positive("head_dim"); err != nil {
			return nil, nil, err
		}
	}
	tied, err := c.boolean("tie_word_embeddings", false) // Qwen3Config's default
	if err != nil {
		return nil, nil, err
	}
	bias, err := c.boolean("attention_bias", false)
	if err != nil {
		return nil, nil, err
	}
	add := func(name string, shape ...int64) { req = append(req, expectedTensor{name, shape}) }
	add("model.embed_tokens.weight", v, hs)
	for i := int64(0); i < l; i++ {
		pre := fmt.Sprintf("model.layers.%d.", i)
		add(pre+"input_layernorm.weight", hs)
		add(pre+"self_attn.q_proj.weight", nh*hd, hs)
		add(pre+"self_attn.k_proj.weight", nkv*hd, hs)
		add(pre+"self_attn.v_proj.weight", nkv*hd, hs)
		add(pre+"self_attn.o_proj.weight", hs, nh*hd)
		if bias {
			add(pre+"self_attn.q_proj.bias", nh*hd)
			add(pre+"self_attn.k_proj.bias", nkv*hd)
			add(pre+"self_attn.v_proj.bias", nkv*hd)
			add(pre+"self_attn.o_proj.bias", hs)
		}
		add(pre+"self_attn.q_norm.weight", hd)
		add(pre+"self_attn.k_norm.weight", hd)
		add(pre+"post_attention_layernorm.weight", hs)
		add(pre+"mlp.gate_proj.weight", inter, hs)
		add(pre+"mlp.up_proj.weight", inter, hs)
		add(pre+"mlp.down_proj.weight", hs, inter)
	}
	add("model.norm.weight", hs)
	if tied {
		opt = append(opt, expectedTensor{"lm_head.weight", []int64{v, hs}})
	} else {
		add("lm_head.weight", v, hs)
	}
	return req, opt, nil
}

// checkTensorSet compares the tensors present (name -> shape) with what the family needs.
// Errors name the tensor and both shapes; field is the prefix used in messages.
func checkTensorSet(family string, config json.RawMessage, have map[string][]int64) error {
	req, opt, err := familyTensors(family, config)
	if err != nil {
		return err
	}
	known := map[string]bool{}
	check := func(t expectedTensor, required bool) error {
		known[t.name] = true
		shape, ok := have[t.name]
		if !ok {
			if required {
				return fmt.Errorf("tensor %q (shape %v) is missing; family %s needs it", t.name, t.shape, family)
			}
			return nil
		}
		if !slices.Equal(shape, t.shape) {
			return fmt.Errorf("tensor %q has shape %v, but config.json implies %v", t.name, shape, t.shape)
		}
		return nil
	}
	for _, t := range req {
		if err := check(t, true); err != nil {
			return err
		}
	}
	for _, t := range opt {
		if err := check(t, false); err != nil {
			return err
		}
	}
	var extra []string
	for n := range have {
		if !known[n] {
			extra = append(extra, n)
		}
	}
	if len(extra) > 0 {
		sort.Strings(extra)
		return fmt.Errorf("tensor %q is not used by family %s (config.json does not describe it)", extra[0], family)
	}
	return nil
}

// configMap is config.json decoded loosely, for reading the few integers a family needs.
type configMap map[string]any

func parseConfig(raw json.RawMessage) (configMap, error) {
	var c configMap
	if err := json.Unmarshal(raw, &c); err != nil || c == nil {
		return nil, fmt.Errorf("config is not a JSON object")
	}
	return c, nil
}

// positive reads an integer > 0.
func (c configMap) positive(key string) (int64, error) {
	v, ok := c[key]
	if !ok || v == nil {
		return 0, fmt.Errorf("config.%s is missing", key)
	}
	f, ok := v.(float64)
	if !ok || f != math.Trunc(f) || f <= 0 || f > 1<<40 {
		return 0, fmt.Errorf("config.%s is %v, want a positive integer", key, v)
	}
	return int64(f), nil
}

// positives reads several positive integers, in order.
func (c configMap) positives(keys ...string) ([]int64, error) {
	out := make([]int64, len(keys))
	for i, k := range keys {
		v, err := c.positive(k)
		if err != nil {
			return nil, err
		}
		out[i] = v
	}
	return out, nil
}

func (c configMap) boolean(key string, def bool) (bool, error) {
	v, ok := c[key]
	if !ok || v == nil {
		return def, nil
	}
	b, ok := v.(bool)
	if !ok {
		return false, fmt.Errorf("config.%s is %v, want true or false", key, v)
	}
	return b, nil
}

// architecture returns the single architecture of config.architectures and its family.
func architecture(config json.RawMessage) (arch, family string, err error) {
	var c struct {
		Architectures []string `json:"architectures"`
	}
	if err := json.Unmarshal(config, &c); err != nil {
		return "", "", fmt.Errorf("config.architectures: %v", err)
	}
	if len(c.Architectures) != 1 {
		return "", "", fmt.Errorf("config.architectures is %q, want exactly one of %s", c.Architectures, knownArchitectureList())
	}
	arch = c.Architectures[0]
	family, ok := knownArchitectures[arch]
	if !ok || family == "mock" {
		return arch, "", fmt.Errorf("config.architectures[0] %q is not supported; known: %s", arch, knownArchitectureList())
	}
	return arch, family, nil
}

func knownArchitectureList() string {
	var names []string
	for a, f := range knownArchitectures {
		if f != "mock" {
			names = append(names, a)
		}
	}
	sort.Strings(names)
	return strings.Join(names, ", ")
}

// TensorShape names a tensor and its shape.
type TensorShape struct {
	Name  string
	Shape []int64
}

// RequiredTensors lists the tensors (Hugging Face names as stored in a bundle, see the package
// doc) that a family's forward pass reads, with the shapes config.json implies. Fixture
// generators use it so generated checkpoints and the bundle checks cannot drift apart.
func RequiredTensors(family string, config json.RawMessage) ([]TensorShape, error) {
	req, _, err := familyTensors(family, config)
	if err != nil {
		return nil, fmt.Errorf("bundle: %v", err)
	}
	out := make([]TensorShape, len(req))
	for i, t := range req {
		out[i] = TensorShape{Name: t.name, Shape: t.shape}
	}
	return out, nil
}

// Families lists the native families a bundle can hold (what a manifest's native_family may
// name).
func Families() []string {
	set := map[string]bool{}
	for _, f := range knownArchitectures {
		set[f] = true
	}
	out := make([]string, 0, len(set))
	for f := range set {
		out = append(out, f)
	}
	sort.Strings(out)
	return out
}
