package reports

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
)

// File names of a run directory (AIPerf's names for the exports).
const (
	ProfileExportJSONL = "profile_export.jsonl"
	AIPerfJSONFile     = "profile_export_aiperf.json"
	AIPerfCSVFile      = "profile_export_aiperf.csv"
	SummaryJSONFile    = "summary.json"
	SummaryMDFile      = "summary.md"
	// ProvenanceFile holds what a run's provenance blob describes (for qual profile: the
	// fingerprints taken before and after); summary.json's provenance field refers to it.
	ProvenanceFile = "provenance.json"
)

// WriteRun writes a run directory: profile_export.jsonl, profile_export_aiperf.json and .csv,
// summary.json, summary.md and the plots. Raw client/server records and logs are written by
// the caller next to them. It returns the Summary it wrote.
func WriteRun(dir string, run *Run) (*Summary, error) {
	if run == nil {
		return nil, fmt.Errorf("reports.WriteRun: run is nil")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("write run %s: %w", dir, err)
	}
	s := Summarize(run)
	if err := writeFile(filepath.Join(dir, ProfileExportJSONL), func(w io.Writer) error {
		return WriteExportJSONL(w, run.Records)
	}); err != nil {
		return s, err
	}
	aj, err := AIPerfJSON(s)
	if err != nil {
		return s, fmt.Errorf("write %s: %w", filepath.Join(dir, AIPerfJSONFile), err)
	}
	if err := os.WriteFile(filepath.Join(dir, AIPerfJSONFile), aj, 0o644); err != nil {
		return s, err
	}
	if err := writeFile(filepath.Join(dir, AIPerfCSVFile), func(w io.Writer) error {
		return WriteAIPerfCSV(w, &s.Profiling)
	}); err != nil {
		return s, err
	}
	if err := WriteSummaryJSON(filepath.Join(dir, SummaryJSONFile), s); err != nil {
		return s, err
	}
	if err := os.WriteFile(filepath.Join(dir, SummaryMDFile), []byte(Markdown(s)), 0o644); err != nil {
		return s, err
	}
	if _, err := PlotRunOf(dir, run); err != nil {
		return s, fmt.Errorf("write plots in %s: %w", dir, err)
	}
	return s, nil
}

// WriteSummaryJSON writes summary.json, indented.
func WriteSummaryJSON(path string, s *Summary) error {
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// ReadSummary reads a run directory's summary.json.
func ReadSummary(dir string) (*Summary, error) {
	b, err := os.ReadFile(filepath.Join(dir, SummaryJSONFile))
	if err != nil {
		return nil, fmt.Errorf("read run summary: %w", err)
	}
	var s Summary
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("read %s: %w", filepath.Join(dir, SummaryJSONFile), err)
	}
	if s.SchemaVersion != SchemaVersion {
		return nil, fmt.Errorf("read %s: schema_version %d is not the one this qual reads (%d); re-run `qual report show` with the qual that wrote it, or re-profile",
			filepath.Join(dir, SummaryJSONFile), s.SchemaVersion, SchemaVersion)
	}
	return &s, nil
}

// ReadRun reads a run directory back into a Run: its settings from summary.json and its
// records from profile_export.jsonl, so that Summarize(run) recomputes every statistic. A
// directory written by AIPerf (no summary.json) is read too, named after the directory.
func ReadRun(dir string) (*Run, error) {
	f, err := os.Open(filepath.Join(dir, ProfileExportJSONL))
	if err != nil {
		if _, gerr := os.Stat(filepath.Join(dir, "profile_export.json")); gerr == nil {
			return nil, fmt.Errorf("read run %s: it holds profile_export.json (GenAI-Perf's layout) and no profile_export.jsonl; this qual reads AIPerf's per-request profile_export.jsonl", dir)
		}
		return nil, fmt.Errorf("read run %s: %w; is it a run directory written by qual profile or AIPerf?", dir, err)
	}
	defer f.Close()
	recs, err := ReadExportJSONL(f)
	if err != nil {
		return nil, fmt.Errorf("read run %s: %w", dir, err)
	}
	if len(recs) == 0 {
		return nil, fmt.Errorf("read run %s: %s holds no request; a run without records cannot be reported or compared", dir, ProfileExportJSONL)
	}
	run := &Run{Name: filepath.Base(filepath.Clean(dir))}
	s, err := ReadSummary(dir)
	switch {
	case err == nil:
		run = &s.Run
	case errors.Is(err, fs.ErrNotExist):
		if b, err := os.ReadFile(filepath.Join(dir, AIPerfJSONFile)); err == nil {
			var a struct {
				InputConfig json.RawMessage `json:"input_config"`
			}
			if json.Unmarshal(b, &a) == nil && len(bytes.TrimSpace(a.InputConfig)) > 0 {
				run.InputConfig = a.InputConfig
			}
		}
	default:
		return nil, err
	}
	run.Records = recs
	return run, nil
}
