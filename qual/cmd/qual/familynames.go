package main

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"

	"github.com/modelqual/modelqual/native"
	"github.com/modelqual/modelqual/qual/manifest"
)

// familyName is every name one family goes by. A family has a folder (families/qwen), the
// label its specs carry (the manifest's family), the runtime registry's name (the manifest's
// native_family, what qual families and bundle headers say: qwen3), the checkpoint
// architectures the runtime accepts for it (Qwen3ForCausalLM) and a tiny fixture
// (qwen3-tiny). The CLI accepts any of them and prints the registry's.
type familyName struct {
	Canonical string   // the runtime registry's name
	Folder    string   // the folder under families/
	Aliases   []string // every accepted name, the canonical one first
}

// familyNames reads the family folders of a checkout and the runtime registry.
func familyNames(root string) ([]familyName, error) {
	folders, err := manifest.Discover(root)
	if err != nil {
		return nil, fmt.Errorf("list families: %w", err)
	}
	arch := map[string][]string{}
	for _, f := range native.Families() {
		arch[f.Name] = f.Architectures
	}
	var out []familyName
	for _, f := range folders {
		if !f.HasManifest {
			continue
		}
		m, err := manifest.Load(filepath.Join(root, "families", f.Name, "manifest.yaml"))
		if err != nil {
			return nil, err
		}
		n := familyName{Canonical: m.NativeFamily, Folder: f.Name}
		if n.Canonical == "" {
			n.Canonical = f.Name
		}
		for _, a := range append([]string{n.Canonical, f.Name, m.Family, m.Checkpoint.Fixture}, arch[m.NativeFamily]...) {
			if a != "" && !slices.Contains(n.Aliases, a) {
				n.Aliases = append(n.Aliases, a)
			}
		}
		out = append(out, n)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no family folders with a manifest.yaml under %s", filepath.Join(root, "families"))
	}
	return out, nil
}

// resolveFamily finds the family a name (any alias, case-insensitively) means.
func resolveFamily(names []familyName, s string) (familyName, bool) {
	for _, n := range names {
		for _, a := range n.Aliases {
			if strings.EqualFold(a, s) {
				return n, true
			}
		}
	}
	return familyName{}, false
}

// describeFamilies lists the families for an error: each canonical name with its aliases.
func describeFamilies(names []familyName) string {
	parts := make([]string, len(names))
	for i, n := range names {
		parts[i] = n.Canonical
		if len(n.Aliases) > 1 {
			parts[i] += " (also " + strings.Join(n.Aliases[1:], ", ") + ")"
		}
	}
	return strings.Join(parts, "; ")
}
