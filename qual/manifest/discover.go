package manifest

import (
	"os"
	"path/filepath"
	"regexp"
	"sort"
)

// Folder is one family folder of a checkout: families/<Name>.
type Folder struct {
	Name string
	Dir  string
	// HasManifest: the folder holds manifest.yaml (a finished family); a freshly scaffolded
	// one (qual new-family) has spec files but no manifest yet.
	HasManifest bool
}

// folderName is what a family folder may be called (a lowercase name; internal/ and
// folders starting with '_' or '.' are not families).
var folderName = regexp.MustCompile(`^[a-z][a-z0-9._-]*$`)

// Discover lists the family folders under root/families that hold a manifest.yaml or spec
// files, sorted by name. It is the one place that says what a family folder is: the label
// vocabulary (qual/spec) and qual qualify both ask it.
func Discover(root string) ([]Folder, error) {
	entries, err := os.ReadDir(filepath.Join(root, "families"))
	if err != nil {
		return nil, err
	}
	var out []Folder
	for _, e := range entries {
		if !e.IsDir() || e.Name() == "internal" || !folderName.MatchString(e.Name()) {
			continue
		}
		dir := filepath.Join(root, "families", e.Name())
		_, merr := os.Stat(filepath.Join(dir, "manifest.yaml"))
		specs, _ := filepath.Glob(filepath.Join(dir, "*_test.go"))
		if merr == nil || len(specs) > 0 {
			out = append(out, Folder{Name: e.Name(), Dir: dir, HasManifest: merr == nil})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}
