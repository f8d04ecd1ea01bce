package spec

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"sort"

	"github.com/modelqual/modelqual/native/bundle"
	"github.com/modelqual/modelqual/qual/manifest"
)

// ProvenanceInput is the input of BundleProvenance and CheckProvenance.
type ProvenanceInput struct {
	// API reaches the served model.
	API *API
	// Manifest names the checkpoint, revision and build settings the served bundle must have.
	Manifest *manifest.Manifest
	// BundleDigest, when set, is the digest of the bundle the harness built and launched; the
	// served bundle must be byte-identical.
	BundleDigest string
	// CheckpointDir, when set, is the local checkpoint snapshot; the sha256 of every
	// checkpoint file the bundle's provenance lists must match it.
	CheckpointDir string
}

var immutableRevision = regexp.MustCompile(`^[0-9a-f]{40}$`)

// CheckProvenance is BundleProvenance's core: the served bundle (GET /mq/v1/bundle) must be
// the one the manifest names (family, checkpoint id, immutable revision, precision, backend,
// max context), be the file the harness built, and have been built from the local
// checkpoint's exact files.
func CheckProvenance(ctx context.Context, in ProvenanceInput) error {
	const fn = "spec.CheckProvenance"
	switch {
	case in.API == nil:
		return fmt.Errorf("%s: ProvenanceInput.API is nil", fn)
	case in.Manifest == nil:
		return fmt.Errorf("%s: ProvenanceInput.Manifest is nil; load the family's manifest.yaml", fn)
	}
	info, err := in.API.Bundle(ctx)
	if err != nil {
		return fmt.Errorf("provenance gate: ask the server which bundle it serves: %w", err)
	}
	if err := CheckHeader(&info.Header, in.Manifest); err != nil {
		return fmt.Errorf("provenance gate: served bundle %s: %w", info.BundlePath, err)
	}
	if in.BundleDigest != "" && info.BundleDigest != in.BundleDigest {
		return fmt.Errorf("provenance gate: the server serves bundle sha256 %s (%s), the harness built and launched %s; another bundle is being served",
			info.BundleDigest, info.BundlePath, in.BundleDigest)
	}
	if in.CheckpointDir != "" {
		names := make([]string, 0, len(info.Header.Provenance.Files))
		for n := range info.Header.Provenance.Files {
			names = append(names, n)
		}
		sort.Strings(names)
		if len(names) == 0 {
			return fmt.Errorf("provenance gate: served bundle lists no checkpoint file hashes (provenance.files); rebuild it with qual bundle build")
		}
		for _, n := range names {
			got, err := fileSHA256(filepath.Join(in.CheckpointDir, n))
			if err != nil {
				return fmt.Errorf("provenance gate: checkpoint file %s named by the bundle: %w", n, err)
			}
			if want := info.Header.Provenance.Files[n]; got != want {
				return fmt.Errorf("provenance gate: checkpoint file %s has sha256 %s locally, the served bundle was built from %s", n, got, want)
			}
		}
	}
	return nil
}

// CheckHeader checks a bundle header against a manifest: what the harness runs before it
// launches anything (a mismatching bundle is refused before any request) and what the
// provenance gate runs on the served header.
func CheckHeader(h *bundle.Header, m *manifest.Manifest) error {
	if !immutableRevision.MatchString(h.Provenance.Revision) {
		return fmt.Errorf("provenance.revision %q is not an immutable 40-hex commit", h.Provenance.Revision)
	}
	if err := h.Check(m.Expect()); err != nil {
		return fmt.Errorf("does not match manifest %s: %w", m.Path(), err)
	}
	return nil
}

func fileSHA256(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
