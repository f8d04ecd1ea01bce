package native

import (
	"encoding/json"
	"fmt"

	"github.com/modelqual/modelqual/native/bundle"
)

// hparams mirrors mq_hparams: each family's config.json names are resolved here, in Go, so the
// C++ side reads one flat struct instead of parsing JSON.
type hparams struct {
	VocabSize, HiddenSize, NumLayers, NumHeads, NumKVHeads, HeadDim, IntermediateSize int
	MaxPositions                                                                      int
	NormEps                                                                           float64
	RopeTheta                                                                         float64
	TieWordEmbeddings, AttentionBias, ScaleAttnByInverseLayerIdx                      bool
	StepDelayNs                                                                       int64
}

type modelSpec struct {
	hp  hparams
	eos []int32
}

// rawConfig holds the config.json fields of every supported family; pointers tell "absent"
// from zero so defaults follow transformers.
type rawConfig struct {
	VocabSize *int `json:"vocab_size"`
	// gpt2
	NEmbd                     *int     `json:"n_embd"`
	NLayer                    *int     `json:"n_layer"`
	NHead                     *int     `json:"n_head"`
	NInner                    *int     `json:"n_inner"`
	NPositions                *int     `json:"n_positions"`
	LayerNormEpsilon          *float64 `json:"layer_norm_epsilon"`
	ActivationFunction        *string  `json:"activation_function"`
	ScaleAttnWeights          *bool    `json:"scale_attn_weights"`
	ScaleAttnByInverseLayerID *bool    `json:"scale_attn_by_inverse_layer_idx"`
	// qwen3
	HiddenSize        *int     `json:"hidden_size"`
	NumHiddenLayers   *int     `json:"num_hidden_layers"`
	NumAttentionHeads *int     `json:"num_attention_heads"`
	NumKeyValueHeads  *int     `json:"num_key_value_heads"`
	HeadDim           *int     `json:"head_dim"`
	IntermediateSize  *int     `json:"intermediate_size"`
	MaxPositionEmbeds *int     `json:"max_position_embeddings"`
	RMSNormEps        *float64 `json:"rms_norm_eps"`
	RopeTheta         *float64 `json:"rope_theta"`
	RopeParameters    *struct {
		RopeTheta *float64 `json:"rope_theta"`
		RopeType  *string  `json:"rope_type"`
	} `json:"rope_parameters"`
	RopeScaling       json.RawMessage `json:"rope_scaling"`
	HiddenAct         *string         `json:"hidden_act"`
	TieWordEmbeddings *bool           `json:"tie_word_embeddings"`
	AttentionBias     *bool           `json:"attention_bias"`
	UseSlidingWindow  *bool           `json:"use_sliding_window"`
	// mock
	StepDelayNs *int64 `json:"step_delay_ns"`
	// shared
	EOSTokenID json.RawMessage `json:"eos_token_id"`
}

func need(name string, v *int) (int, error) {
	if v == nil || *v <= 0 {
		return 0, fmt.Errorf("config.json: %s is missing or not positive", name)
	}
	return *v, nil
}

func orInt(v *int, d int) int {
	if v == nil {
		return d
	}
	return *v
}

func orFloat(v *float64, d float64) float64 {
	if v == nil {
		return d
	}
	return *v
}

// modelSpecFor resolves the hyperparameters and EOS ids of a bundle, refusing configurations
// the runtime does not implement rather than computing something else.
func modelSpecFor(h *bundle.Header) (modelSpec, error) {
	var c rawConfig
	if err := json.Unmarshal(h.Config, &c); err != nil {
		return modelSpec{}, fmt.Errorf("config.json: %v", err)
	}
	var s modelSpec
	var err error
	hp := &s.hp
	switch h.Family {
	case "gpt2":
		if hp.VocabSize, err = need("vocab_size", c.VocabSize); err != nil {
			return s, err
		}
		if hp.HiddenSize, err = need("n_embd", c.NEmbd); err != nil {
			return s, err
		}
		if hp.NumLayers, err = need("n_layer", c.NLayer); err != nil {
			return s, err
		}
		if hp.NumHeads, err = need("n_head", c.NHead); err != nil {
			return s, err
		}
		if hp.MaxPositions, err = need("n_positions", c.NPositions); err != nil {
			return s, err
		}
		if hp.HiddenSize%hp.NumHeads != 0 {
			return s, fmt.Errorf("config.json: n_embd %d is not a multiple of n_head %d", hp.HiddenSize, hp.NumHeads)
		}
		hp.NumKVHeads = hp.NumHeads
		hp.HeadDim = hp.HiddenSize / hp.NumHeads
		hp.IntermediateSize = orInt(c.NInner, 4*hp.HiddenSize)
		hp.NormEps = orFloat(c.LayerNormEpsilon, 1e-5)
		hp.TieWordEmbeddings = true
		if c.ActivationFunction != nil && *c.ActivationFunction != "gelu_new" {
			return s, fmt.Errorf("config.json: activation_function %q is not supported; the gpt2 runtime implements gelu_new", *c.ActivationFunction)
		}
		if c.ScaleAttnWeights != nil && !*c.ScaleAttnWeights {
			return s, fmt.Errorf("config.json: scale_attn_weights false is not supported")
		}
		hp.ScaleAttnByInverseLayerIdx = c.ScaleAttnByInverseLayerID != nil && *c.ScaleAttnByInverseLayerID
	case "qwen3":
		if hp.VocabSize, err = need("vocab_size", c.VocabSize); err != nil {
			return s, err
		}
		if hp.HiddenSize, err = need("hidden_size", c.HiddenSize); err != nil {
			return s, err
		}
		if hp.NumLayers, err = need("num_hidden_layers", c.NumHiddenLayers); err != nil {
			return s, err
		}
		if hp.NumHeads, err = need("num_attention_heads", c.NumAttentionHeads); err != nil {
			return s, err
		}
		if hp.IntermediateSize, err = need("intermediate_size", c.IntermediateSize); err != nil {
			return s, err
		}
		if hp.MaxPositions, err = need("max_position_embeddings", c.MaxPositionEmbeds); err != nil {
			return s, err
		}
		hp.NumKVHeads = orInt(c.NumKeyValueHeads, hp.NumHeads)
		hp.HeadDim = orInt(c.HeadDim, hp.HiddenSize/hp.NumHeads)
		if hp.NumKVHeads <= 0 || hp.NumHeads%hp.NumKVHeads != 0 {
			return s, fmt.Errorf("config.json: num_attention_heads %d is not a multiple of num_key_value_heads %d", hp.NumHeads, hp.NumKVHeads)
		}
		if hp.HeadDim <= 0 || hp.HeadDim%2 != 0 {
			return s, fmt.Errorf("config.json: head_dim %d must be positive and even (RoPE rotates halves)", hp.HeadDim)
		}
		hp.NormEps = orFloat(c.RMSNormEps, 1e-6)
		hp.RopeTheta = 10000
		if c.RopeTheta != nil {
			hp.RopeTheta = *c.RopeTheta
		} else if c.RopeParameters != nil && c.RopeParameters.RopeTheta != nil {
			hp.RopeTheta = *c.RopeParameters.RopeTheta
		}
		if c.RopeParameters != nil && c.RopeParameters.RopeType != nil && *c.RopeParameters.RopeType != "default" {
			return s, fmt.Errorf("config.json: rope_parameters.rope_type %q is not supported; only default RoPE", *c.RopeParameters.RopeType)
		}
		if len(c.RopeScaling) > 0 && string(c.RopeScaling) != "null" {
			return s, fmt.Errorf("config.json: rope_scaling %s is not supported; only default RoPE", c.RopeScaling)
		}
		if c.HiddenAct != nil && *c.HiddenAct != "silu" {
			return s, fmt.Errorf("config.json: hidden_act %q is not supported; the qwen3 runtime implements silu", *c.HiddenAct)
		}
		if c.UseSlidingWindow != nil && *c.UseSlidingWindow {
			return s, fmt.Errorf("config.json: use_sliding_window true is not supported")
		}
		// transformers' Qwen3Config defaults tie_word_embeddings to false.
		hp.TieWordEmbeddings = c.TieWordEmbeddings != nil && *c.TieWordEmbeddings
		hp.AttentionBias = c.AttentionBias != nil && *c.AttentionBias
	case "mock":
		if hp.VocabSize, err = need("vocab_size", c.VocabSize); err != nil {
			return s, err
		}
		hp.MaxPositions = orInt(c.MaxPositionEmbeds, 1<<20)
		if c.StepDelayNs != nil {
			hp.StepDelayNs = *c.StepDelayNs
		}
		if hp.StepDelayNs < 0 {
			return s, fmt.Errorf("config.json: step_delay_ns %d is negative", hp.StepDelayNs)
		}
	default:
		return s, fmt.Errorf("family %q has no native model; known: gpt2, qwen3, mock", h.Family)
	}

	// EOS ids: generation_config.json wins over config.json, as in transformers' generate.
	var g struct {
		EOSTokenID json.RawMessage `json:"eos_token_id"`
	}
	if len(h.GenerationConfig) > 0 {
		if err := json.Unmarshal(h.GenerationConfig, &g); err != nil {
			return s, fmt.Errorf("generation_config.json: %v", err)
		}
	}
	raw := g.EOSTokenID
	if len(raw) == 0 || string(raw) == "null" {
		raw = c.EOSTokenID
	}
	if s.eos, err = parseIDs(raw); err != nil {
		return s, fmt.Errorf("eos_token_id: %v", err)
	}
	kept := s.eos[:0]
	for _, id := range s.eos {
		if id >= 0 && int(id) < hp.VocabSize {
			kept = append(kept, id) // the mock's -1 means "no EOS"
		}
	}
	s.eos = kept
	return s, nil
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
