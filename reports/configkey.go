package reports

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// KeyField is one setting of a run's configuration key.
type KeyField struct {
	Name  string `json:"name"`
	Value string `json:"value"`
	// Server marks a setting of the system under test (model, bundle, server flags): it may
	// differ between the base and the candidate of a comparison (that is what they compare),
	// never among the repeats of one side. The other fields are the load: they must match
	// for two runs to be compared at all.
	Server bool `json:"server,omitempty"`
}

// ConfigKey is what makes two runs repeats of one configuration: the load they were given
// (endpoint, stream, concurrency or rate, input and output lengths, ...) and the server they
// measured (model, bundle digest, server flags). A field a run did not record is absent,
// and an absent field matches any value: a run written by AIPerf or an older qual is not
// refused for what it could not say.
//
// The key is computed from what a run directory already records (summary.json's
// input_config, sweep, target and environment), so runs written before it existed have one.
type ConfigKey []KeyField

// keyOrder fixes the order fields are printed in; load fields first.
var keyOrder = []string{
	"endpoint", "stream", "load", "concurrency", "request_rate", "arrival",
	"input_tokens_mean", "input_tokens_stddev", "num_prompts", "prompts", "input_file", "dataset_type",
	"output_tokens", "output_tokens_stddev", "prompt_output_tokens",
	"image_dir", "image_width_mean", "image_height_mean", "image_width_stddev", "image_height_stddev",
	"image_format", "image_fraction", "cancel_rate", "cancel_delay", "extra_body", "slo",
	"model", "server", "url", "bundle", "server_args", "server_env",
}

// mqConfigFields maps the names the CLI's flags (qual profile, recorded as mq_config) and the
// family specs' descriptions (describeConfig in qual/load) give a load setting to its key
// field. Flags that say how the run is measured rather than what is loaded (request count,
// duration, warmup, seed, output folder, timeouts) are not part of the key: runs differing
// only there are repeats.
var mqConfigFields = map[string]string{
	"input-tokens-mean": "input_tokens_mean", "input-tokens-stddev": "input_tokens_stddev",
	"num-prompts": "num_prompts", "prompts": "prompts", "input-file": "input_file",
	"custom-dataset-type": "dataset_type",
	"output-tokens":       "output_tokens", "output_tokens": "output_tokens",
	"output-tokens-stddev": "output_tokens_stddev", "prompt_output_tokens": "prompt_output_tokens",
	"image-dir": "image_dir", "image-width-mean": "image_width_mean", "image-height-mean": "image_height_mean",
	"image-width-stddev": "image_width_stddev", "image-height-stddev": "image_height_stddev",
	"image-format": "image_format", "image-fraction": "image_fraction",
	"cancel-rate": "cancel_rate", "cancel_rate": "cancel_rate",
	"cancel-delay": "cancel_delay", "cancel_delay": "cancel_delay", "slo": "slo",
	"extra_body": "extra_body",
}

// serverFields are the settings of the system under test.
var serverFields = map[string]bool{"model": true, "server": true, "url": true, "bundle": true, "server_args": true, "server_env": true}

// launchPlumbing are qual-server flags a launcher sets per start (a free port, the records
// file, the bundle's path, whose content the bundle field names): they differ between
// repeats without making a different server.
var launchPlumbing = map[string]bool{"bundle": true, "model-name": true, "host": true, "port": true,
	"records": true, "startup-timeout": true, "grpc-port": true}

// RunKey computes a run's configuration key from what it recorded.
func RunKey(run *Run) ConfigKey {
	vals := map[string]string{}
	set := func(name, v string) {
		if _, done := vals[name]; !done && v != "" {
			vals[name] = v
		}
	}
	var ic struct {
		Endpoint struct {
			Type       string   `json:"type"`
			Streaming  *bool    `json:"streaming"`
			ModelNames []string `json:"model_names"`
		} `json:"endpoint"`
		Loadgen struct {
			Concurrency     *float64 `json:"concurrency"`
			RequestRate     *float64 `json:"request_rate"`
			RequestRateMode string   `json:"request_rate_mode"`
			CancelRate      *float64 `json:"request_cancellation_rate"`
		} `json:"loadgen"`
		Input struct {
			FixedSchedule bool `json:"fixed_schedule"`
			Prompt        struct {
				InputTokens  struct{ Mean, Stddev *float64 } `json:"input_tokens"`
				OutputTokens struct{ Mean, Stddev *float64 } `json:"output_tokens"`
			} `json:"prompt"`
		} `json:"input"`
		MQConfig map[string]any `json:"mq_config"`
	}
	if len(run.InputConfig) > 0 {
		_ = json.Unmarshal(run.InputConfig, &ic) // a malformed input_config leaves the fields unknown
	}

	// The load: the sweep point first (it names the parameter), then AIPerf's layout.
	set("endpoint", ic.Endpoint.Type)
	if ic.Endpoint.Streaming != nil {
		set("stream", strconv.FormatBool(*ic.Endpoint.Streaming))
	}
	switch {
	case run.Sweep != nil && run.Sweep.Parameter == "concurrency":
		set("load", "closed")
		set("concurrency", num(run.Sweep.Value))
	case run.Sweep != nil && run.Sweep.Parameter == "request_rate":
		set("load", "open")
		set("request_rate", num(run.Sweep.Value))
	case run.Sweep != nil && run.Sweep.Parameter == "fixed_schedule", ic.Input.FixedSchedule:
		set("load", "trace")
	case ic.Loadgen.RequestRate != nil:
		set("load", "open")
		set("request_rate", num(*ic.Loadgen.RequestRate))
	case ic.Loadgen.Concurrency != nil:
		set("load", "closed")
		set("concurrency", num(*ic.Loadgen.Concurrency))
	}
	if vals["load"] == "open" {
		set("arrival", ic.Loadgen.RequestRateMode)
		c := "none"
		if ic.Loadgen.Concurrency != nil && *ic.Loadgen.Concurrency > 0 {
			c = num(*ic.Loadgen.Concurrency) // the open loop's cap
		}
		set("concurrency", c)
	}
	for _, kv := range []struct {
		name string
		v    *float64
	}{{"input_tokens_mean", ic.Input.Prompt.InputTokens.Mean}, {"input_tokens_stddev", ic.Input.Prompt.InputTokens.Stddev},
		{"output_tokens", ic.Input.Prompt.OutputTokens.Mean}, {"output_tokens_stddev", ic.Input.Prompt.OutputTokens.Stddev}} {
		if kv.v != nil {
			set(kv.name, num(*kv.v))
		}
	}
	if ic.Loadgen.CancelRate != nil {
		set("cancel_rate", num(*ic.Loadgen.CancelRate/100)) // AIPerf records percent
	}
	for flag, v := range ic.MQConfig {
		if name, ok := mqConfigFields[flag]; ok {
			set(name, anyString(v))
		}
	}
	if f, ok := ic.MQConfig["endpoint"]; ok {
		set("endpoint", anyString(f))
	}
	if f, ok := ic.MQConfig["stream"]; ok {
		set("stream", anyString(f))
	}

	// The server.
	tgt := targetFields(run.Target)
	set("model", tgt["model"])
	if len(ic.Endpoint.ModelNames) > 0 {
		set("model", ic.Endpoint.ModelNames[0])
	}
	set("server", tgt["server"])
	if tgt["server"] == "external" {
		set("url", tgt["url"]) // an external server is known by its address only
	}
	// The bundle's identity: its digest where the run records one, else its file sha256.
	set("bundle", tgt["bundle_digest"])
	set("bundle", tgt["bundle_sha256"])
	if len(run.Environment) > 0 {
		var env struct {
			ServerArgs []string `json:"server_args"`
			ServerEnv  []string `json:"server_env"`
			ServerKind string   `json:"server_kind"`
		}
		if json.Unmarshal(run.Environment, &env) == nil {
			if env.ServerKind != "external" {
				vals["server_args"] = strings.Join(serverFlags(env.ServerArgs), " ")
				vals["server_env"] = strings.Join(env.ServerEnv, " ")
			}
		}
	}

	// Image settings matter only where requests carried images.
	if w := vals["image_width_mean"]; vals["image_dir"] == "" && (w == "" || w == "0") {
		for name := range vals {
			if strings.HasPrefix(name, "image_") {
				delete(vals, name)
			}
		}
	}
	var k ConfigKey
	for _, name := range keyOrder {
		if v, ok := vals[name]; ok {
			k = append(k, KeyField{Name: name, Value: v, Server: serverFields[name]})
		}
	}
	return k
}

// targetFields reads the run's target as JSON, so that whichever bundle identity it carries
// (a digest, a file sha256) is found by name.
func targetFields(t *Target) map[string]string {
	out := map[string]string{}
	if t == nil {
		return out
	}
	b, err := json.Marshal(t)
	if err != nil {
		return out
	}
	var m map[string]any
	_ = json.Unmarshal(b, &m)
	for k, v := range m {
		if s, ok := v.(string); ok {
			out[k] = s
		}
	}
	return out
}

// serverFlags drops the launch plumbing from qual-server's argument list (without the
// binary), keeping the flags that change the server (--max-batch 64, --device cuda, ...).
func serverFlags(args []string) []string {
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		args = args[1:] // the binary
	}
	var out []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		name := strings.TrimLeft(a, "-")
		name, _, inline := strings.Cut(name, "=")
		if strings.HasPrefix(a, "-") && launchPlumbing[name] {
			if !inline {
				i++ // its value
			}
			continue
		}
		out = append(out, a)
	}
	return out
}

func num(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) }

// CanonicalExtraBody writes the fields a run merged into every request body (qual profile
// --extra-body and --temperature, a spec's Config.Extra) as the configuration key compares
// them: compact JSON with sorted keys, "{}" for none, so that the same body written two ways
// is one configuration and a different one (another temperature) is another. A run made with
// a different extra body is a different configuration, never a repeat.
func CanonicalExtraBody(extra map[string]any) string {
	if len(extra) == 0 {
		return "{}"
	}
	b, err := json.Marshal(extra) // maps marshal with sorted keys
	if err != nil {
		return fmt.Sprintf("unencodable: %v", err)
	}
	// Numbers written alike (0, 0.0, 0e0) are the same setting.
	var v any
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.UseNumber()
	if dec.Decode(&v) == nil {
		v = normalizeNumbers(v)
		if nb, err := json.Marshal(v); err == nil {
			return string(nb)
		}
	}
	return string(b)
}

// normalizeNumbers rewrites JSON numbers in their shortest float form.
func normalizeNumbers(v any) any {
	switch x := v.(type) {
	case json.Number:
		if f, err := x.Float64(); err == nil {
			return json.Number(strconv.FormatFloat(f, 'g', -1, 64))
		}
	case map[string]any:
		for k, e := range x {
			x[k] = normalizeNumbers(e)
		}
	case []any:
		for i, e := range x {
			x[i] = normalizeNumbers(e)
		}
	}
	return v
}

// anyString writes a recorded setting as text; a list (per-prompt output lengths) becomes a
// short digest, since only its identity matters for the key.
func anyString(v any) string {
	switch x := v.(type) {
	case nil:
		return ""
	case string:
		return x
	case float64:
		return num(x)
	case bool:
		return strconv.FormatBool(x)
	}
	b, _ := json.Marshal(v)
	s := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(s[:6])
}

// Get returns the value of a field and whether the run recorded it.
func (k ConfigKey) Get(name string) (string, bool) {
	for _, f := range k {
		if f.Name == name {
			return f.Value, true
		}
	}
	return "", false
}

// KeyDiff is one field on which two keys differ.
type KeyDiff struct {
	Field  string `json:"field"`
	A      string `json:"a"`
	B      string `json:"b"`
	Server bool   `json:"server,omitempty"`
}

func (d KeyDiff) String() string {
	a, b := aroundDifference(d.A, d.B, 24)
	return fmt.Sprintf("%s %s vs %s", d.Field, quoteEmpty(a), quoteEmpty(b))
}

// aroundDifference shortens two values to at most n runes each, keeping where they first
// differ in view: two long values with a common start (two extra bodies) would otherwise be
// cut to the same text.
func aroundDifference(a, b string, n int) (string, string) {
	ra, rb := []rune(a), []rune(b)
	i := 0
	for i < len(ra) && i < len(rb) && ra[i] == rb[i] {
		i++
	}
	if i < n-6 {
		return shorten(a, n), shorten(b, n)
	}
	from := i - 6 // some context before the difference
	cut := func(r []rune) string {
		return "…" + shorten(string(r[from:]), n-1)
	}
	return cut(ra), cut(rb)
}

func quoteEmpty(s string) string {
	if s == "" {
		return `""`
	}
	return s
}

// shorten cuts s to at most n runes, marking the cut.
func shorten(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n-1]) + "…"
}

// Diff lists the fields recorded by both keys whose values differ, in key order, leaving
// out the ignored field names. load selects the load fields, server the server's.
func (k ConfigKey) Diff(o ConfigKey, load, server bool, ignore []string) []KeyDiff {
	var out []KeyDiff
	for _, f := range k {
		if slices.Contains(ignore, f.Name) || f.Server && !server || !f.Server && !load {
			continue
		}
		if v, ok := o.Get(f.Name); ok && v != f.Value {
			out = append(out, KeyDiff{Field: f.Name, A: f.Value, B: v, Server: f.Server})
		}
	}
	return out
}

// Point names the sweep point of a key: "concurrency=4", "request_rate=10", "trace", or
// "-" when the run did not record its load.
func (k ConfigKey) Point() string {
	switch load, _ := k.Get("load"); load {
	case "closed":
		c, _ := k.Get("concurrency")
		return "concurrency=" + c
	case "open":
		r, _ := k.Get("request_rate")
		return "request_rate=" + r
	case "trace":
		return "trace"
	}
	return "-"
}

// String writes the key as name=value pairs in key order.
func (k ConfigKey) String() string {
	parts := make([]string, len(k))
	for i, f := range k {
		parts[i] = f.Name + "=" + quoteEmpty(f.Value)
	}
	return strings.Join(parts, " ")
}

// KeyFieldNames lists the field names a key may hold, for --ignore's help and checks.
func KeyFieldNames() []string { return slices.Clone(keyOrder) }
