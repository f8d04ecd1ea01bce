package bundle

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"sort"
	"strings"
)

// Layout is what a family reads from a bundle, as the runtime declares it for a config
// (native.Layout): the family's own loading code lists the tensors, so the list cannot drift
// from what a worker opening the bundle reads. Build uses it to bring a checkpoint saved in
// another layout (with or without a base-model prefix, a task model's head beside a base model,
// a tied head stored anyway) to the names the family reads, as transformers and diffusers load
// such checkpoints, and to refuse, before anything is written, a checkpoint no worker could open.
type Layout struct {
	// Tensors the family reads, each with the shape its config implies (trailing dimensions
	// past the fourth folded into it, as the bundle stores them).
	Tensors []LayoutTensor `json:"tensors"`
	// Renames apply to a tensor the family does not read under its checkpoint name: From at
	// the start of the name becomes To, and the first rule giving a name the family reads or
	// carries (or drops) wins; a carried tensor no rule renames keeps its name.
	Renames []LayoutRename `json:"renames"`
	// Splits cut a checkpoint tensor stored fused (transformers 5's 3-D experts) into the
	// tensors the family reads, before the renames apply.
	Splits []LayoutSplit `json:"splits,omitempty"`
	// Carried are patterns ('*' matches any run of characters) of tensors the bundle keeps but
	// the family never reads (a VAE encoder a text-to-image pipeline does not run, causal-mask
	// buffers).
	Carried []string `json:"carried"`
	// Dropped are patterns of tensors the reference loader discards (a head tied to the
	// embedding, a task head a base model does not have): they are left out of the bundle and
	// listed in provenance.skipped_tensors.
	Dropped []string `json:"dropped"`
}

// LayoutTensor is one tensor a family reads.
type LayoutTensor struct {
	Name  string  `json:"name"`
	Shape []int64 `json:"shape"`
}

// LayoutSplit: a checkpoint tensor whose name ends with From (what comes before it, P, kept)
// of shape [N, len(To)*M, ...] is N*len(To) tensors named P + To[j] with '*' replaced by n, each
// of shape [M, ...]: the (n*len(To)+j)-th of equal consecutive byte ranges, so nothing is
// computed. transformers 5 saves a mixture of experts' gate_up_proj [experts, 2*width, hidden]
// this way: per expert, the gate's rows, then the up projection's.
type LayoutSplit struct {
	From string   `json:"from"`
	To   []string `json:"to"`
}

// split applies sp to t when t's name ends with sp.From: the parts, or nil.
func (sp LayoutSplit) split(t stTensor) ([]stTensor, error) {
	prefix, ok := strings.CutSuffix(t.Name, sp.From)
	if !ok || len(sp.To) == 0 {
		return nil, nil
	}
	k := int64(len(sp.To))
	if len(t.Shape) < 2 || t.Shape[0] < 1 || t.Shape[1]%k != 0 {
		return nil, fmt.Errorf("tensor %q of shape %v: a fused tensor split into %d parts needs shape [N, %d*M, ...]", t.Name, t.Shape, k, k)
	}
	parts := t.Shape[0] * k
	if t.Size%parts != 0 {
		return nil, fmt.Errorf("tensor %q: %d bytes do not split into %d equal parts", t.Name, t.Size, parts)
	}
	size := t.Size / parts
	shape := append([]int64{t.Shape[1] / k}, t.Shape[2:]...)
	var out []stTensor
	for n := int64(0); n < t.Shape[0]; n++ {
		for j, to := range sp.To {
			p := t
			p.Name = prefix + strings.ReplaceAll(to, "*", fmt.Sprint(n))
			p.Shape = shape
			p.Offset = t.Offset + (n*k+int64(j))*size
			p.Size = size
			out = append(out, p)
		}
	}
	return out, nil
}

// LayoutRename maps a checkpoint name prefix to the family's.
type LayoutRename struct {
	From string `json:"from"`
	To   string `json:"to"`
}

// matchPattern reports whether name matches pattern, where '*' matches any run of characters
// (tensor names hold dots, so path.Match's rules would not help).
func matchPattern(pattern, name string) bool {
	parts := strings.Split(pattern, "*")
	if len(parts) == 1 {
		return pattern == name
	}
	if !strings.HasPrefix(name, parts[0]) {
		return false
	}
	name = name[len(parts[0]):]
	last := parts[len(parts)-1]
	for _, p := range parts[1 : len(parts)-1] {
		i := strings.Index(name, p)
		if i < 0 {
			return false
		}
		name = name[i+len(p):]
	}
	return strings.HasSuffix(name, last)
}

func matchAny(patterns []string, name string) bool {
	for _, p := range patterns {
		if matchPattern(p, name) {
			return true
		}
	}
	return false
}

// maxListedProblems bounds the lines of a layout error; the count says how many more there are.
const maxListedProblems = 12

// applyLayout renames s's tensors to the names family fam reads, leaves out what its layout
// drops, and checks that every tensor it reads is there with its shape and that nothing is
// left it never reads. dir is the checkpoint, for messages.
func (s *source) applyLayout(dir string, fam Family) error {
	l := fam.Layout
	// A tensor the family reads when present but the layout drops (a tied head) is not needed.
	var need []LayoutTensor
	want := make(map[string][]int64, len(l.Tensors))
	for _, t := range l.Tensors {
		if !matchAny(l.Dropped, t.Name) {
			need = append(need, t)
			want[t.Name] = t.Shape
		}
	}
	known := func(name string) bool { _, ok := want[name]; return ok || matchAny(l.Carried, name) }
	rel := func(t stTensor) string {
		if r, err := filepath.Rel(dir, t.File); err == nil {
			return r
		}
		return t.File
	}
	if len(l.Splits) > 0 {
		var split []stTensor
		fused := map[string]int{}
		for _, t := range s.tensors {
			var parts []stTensor
			if _, read := want[t.Name]; !read {
				for _, sp := range l.Splits {
					p, err := sp.split(t)
					if err != nil {
						return fmt.Errorf("bundle: checkpoint %s: %v (in %s)", dir, err, rel(t))
					}
					if parts = p; parts != nil {
						fused[sp.From]++
						break
					}
				}
			}
			if parts == nil {
				parts = []stTensor{t}
			}
			split = append(split, parts...)
		}
		s.tensors = split
		for from, n := range fused {
			s.renamed = append(s.renamed, fmt.Sprintf("*%s split (%d fused tensors)", from, n))
		}
	}
	var kept []stTensor
	var unread []string
	renamed := map[LayoutRename]int{}
	from := map[string]stTensor{} // bundle name -> the checkpoint tensor it came from
	for _, t := range s.tensors {
		name, drop := t.Name, matchAny(l.Dropped, t.Name)
		if _, read := want[name]; !drop && !read {
			for _, r := range l.Renames {
				if !strings.HasPrefix(t.Name, r.From) {
					continue
				}
				if n := r.To + t.Name[len(r.From):]; matchAny(l.Dropped, n) || known(n) {
					name, drop = n, matchAny(l.Dropped, n)
					renamed[r]++
					break
				}
			}
		}
		switch {
		case drop:
			s.skipped = append(s.skipped, fmt.Sprintf("%s (dropped: family %s does not load it)", t.Name, fam.Name))
			continue
		case !known(name):
			unread = append(unread, fmt.Sprintf("tensor %q in %s: family %s reads it under no name it accepts", t.Name, rel(t), fam.Name))
			continue
		}
		if prev, dup := from[name]; dup {
			return fmt.Errorf("bundle: checkpoint %s: tensors %q (%s) and %q (%s) are both %q for family %s; keep one layout", dir, prev.Name, rel(prev), t.Name, rel(t), name, fam.Name)
		}
		from[name] = t
		t.Name = name
		kept = append(kept, t)
	}
	var problems []string
	for _, w := range need {
		t, ok := from[w.Name]
		switch {
		case !ok:
			problems = append(problems, fmt.Sprintf("tensor %q: expected shape %v (from config.json), found none%s", w.Name, w.Shape, alsoLookedFor(l, w.Name)))
		case !slices.Equal(storedShape(t.Shape), w.Shape):
			stored := ""
			if len(t.Shape) > 4 {
				stored = fmt.Sprintf(" (stored as %v)", storedShape(t.Shape))
			}
			problems = append(problems, fmt.Sprintf("tensor %q: expected shape %v (from config.json), found %v%s as %q in %s", w.Name, w.Shape, t.Shape, stored, t.Name, rel(t)))
		}
	}
	problems = append(problems, unread...)
	if len(problems) > 0 {
		var shards []string
		for _, f := range s.shards {
			shards = append(shards, f.key)
		}
		sort.Strings(shards)
		n := len(problems)
		if n > maxListedProblems {
			problems = append(problems[:maxListedProblems], fmt.Sprintf("... and %d more", n-maxListedProblems))
		}
		return fmt.Errorf("bundle: checkpoint %s does not hold what family %s reads (%d problems; searched %s):\n  %s\nbuild from a checkpoint that matches its config.json",
			dir, fam.Name, n, strings.Join(shards, ", "), strings.Join(problems, "\n  "))
	}
	for r, n := range renamed {
		s.renamed = append(s.renamed, fmt.Sprintf("%q -> %q (%d tensors)", r.From, r.To, n))
	}
	sort.Strings(s.renamed)
	sort.Slice(kept, func(i, j int) bool { return kept[i].Name < kept[j].Name })
	s.tensors = kept
	return nil
}

// alsoLookedFor names the checkpoint names the layout's renames accept for name.
func alsoLookedFor(l *Layout, name string) string {
	var alt []string
	for _, r := range l.Renames {
		if strings.HasPrefix(name, r.To) {
			if a := r.From + name[len(r.To):]; a != name && !slices.Contains(alt, a) {
				alt = append(alt, fmt.Sprintf("%q", a))
			}
		}
	}
	if len(alt) == 0 {
		return ""
	}
	return " (also looked for " + strings.Join(alt, ", ") + ")"
}

// safetensorsIndex is a sharded checkpoint's index (model.safetensors.index.json, or diffusers'
// diffusion_pytorch_model.safetensors.index.json): which shard holds each tensor.
type safetensorsIndex struct {
	WeightMap map[string]string `json:"weight_map"`
}

// parseSafetensorsIndex reads an index and returns its weight map and its shards, sorted. A
// shard must be a file of the checkpoint's directory (no path), named *.safetensors.
func parseSafetensorsIndex(b []byte) (map[string]string, []string, error) {
	var ix safetensorsIndex
	if err := json.Unmarshal(b, &ix); err != nil {
		return nil, nil, fmt.Errorf("the safetensors index is not JSON with a weight_map object: %v", err)
	}
	if len(ix.WeightMap) == 0 {
		return nil, nil, fmt.Errorf("the safetensors index has no weight_map entries")
	}
	set := map[string]bool{}
	for name, f := range ix.WeightMap {
		if f == "" || f != filepath.Base(f) || f == "." || f == ".." || strings.ContainsAny(f, `/\`) {
			return nil, nil, fmt.Errorf("the safetensors index puts tensor %q in shard %q, outside the directory", name, f)
		}
		if !strings.HasSuffix(f, ".safetensors") {
			return nil, nil, fmt.Errorf("the safetensors index puts tensor %q in %q, not a .safetensors file", name, f)
		}
		set[f] = true
	}
	shards := make([]string, 0, len(set))
	for f := range set {
		shards = append(shards, f)
	}
	sort.Strings(shards)
	return ix.WeightMap, shards, nil
}
