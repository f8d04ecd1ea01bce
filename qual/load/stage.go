package load

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// FailedFile marks a run folder kept after a failed run: it says when and why the run
// failed. The folder itself is renamed <out>.failed-<UTC time>.
const FailedFile = "FAILED"

// Stage is a run folder being written. The run goes into a temporary folder beside the final
// one (<out>.partial-*), which Finish renames to the final name when the run ends well, or to
// <out>.failed-<UTC time> with a FAILED note when it does not. So a half-written or failed
// run never occupies --out, and retrying into the same --out just works.
type Stage struct {
	// Out is the final folder (absolute); Dir is where the run is written meanwhile.
	Out, Dir  string
	overwrite bool
	final     string
	done      bool
	now       func() time.Time
}

// StageRun starts a run bound for out: it refuses an out that already holds a run (unless
// overwrite, which replaces it when the new run ends well) and creates the temporary folder
// beside it, on the same file system so that the final rename is atomic.
func StageRun(out string, overwrite bool) (*Stage, error) {
	if out == "" {
		return nil, errors.New("load.StageRun: the output folder is empty; pass --out DIR")
	}
	abs, err := filepath.Abs(out)
	if err != nil {
		return nil, fmt.Errorf("output folder %s: %w", out, err)
	}
	if !overwrite {
		if err := RefuseExistingRun(abs); err != nil {
			return nil, err
		}
	}
	if err := os.MkdirAll(filepath.Dir(abs), 0o755); err != nil {
		return nil, fmt.Errorf("output folder %s: %w", out, err)
	}
	dir, err := os.MkdirTemp(filepath.Dir(abs), filepath.Base(abs)+".partial-")
	if err != nil {
		return nil, fmt.Errorf("output folder %s: create the temporary folder beside it: %w", out, err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		return nil, fmt.Errorf("output folder %s: %w", out, err)
	}
	return &Stage{Out: abs, Dir: dir, overwrite: overwrite, now: time.Now}, nil
}

// Finish ends the run: with runErr nil it renames the temporary folder to Out (replacing a
// previous run there only when the stage was made with overwrite); otherwise it writes
// FAILED (when and why) into it and renames it to <Out>.failed-<UTC time>. It returns where
// the run now lies. Only the first call acts; later ones return the same place.
func (s *Stage) Finish(runErr error) (string, error) {
	if s.done {
		return s.final, nil
	}
	s.done = true
	now := s.now().UTC()
	if runErr == nil {
		err := s.replaceOut(now)
		if err == nil {
			s.final = s.Out
			return s.final, nil
		}
		runErr = err // keep the run, marked failed, rather than lose it
	}
	note := fmt.Sprintf("run failed at %s\n%s\n", now.Format(time.RFC3339Nano), runErr)
	if err := os.WriteFile(filepath.Join(s.Dir, FailedFile), []byte(note), 0o644); err != nil {
		s.final = s.Dir
		return s.Dir, fmt.Errorf("mark the failed run in %s: %w", s.Dir, err)
	}
	failed := s.Out + ".failed-" + now.Format("20060102T150405.000Z")
	if err := os.Rename(s.Dir, failed); err != nil {
		s.final = s.Dir
		return s.Dir, fmt.Errorf("keep the failed run: rename %s to %s: %w", s.Dir, failed, err)
	}
	s.final = failed
	return failed, nil
}

// replaceOut renames the finished run to Out. A run already at Out is moved aside first and
// removed once the new one is in place (overwrite only); without overwrite, a run that
// appeared at Out while this one ran is left alone and this one is reported failed.
func (s *Stage) replaceOut(now time.Time) error {
	if err := RefuseExistingRun(s.Out); err != nil {
		if !s.overwrite {
			return fmt.Errorf("%w (it appeared while this run was written)", err)
		}
		old := s.Out + ".replaced-" + now.Format("20060102T150405.000Z")
		if err := os.Rename(s.Out, old); err != nil {
			return fmt.Errorf("replace the run in %s: %w", s.Out, err)
		}
		if err := os.Rename(s.Dir, s.Out); err != nil {
			_ = os.Rename(old, s.Out)
			return fmt.Errorf("rename %s to %s: %w", s.Dir, s.Out, err)
		}
		return os.RemoveAll(old)
	}
	_ = os.Remove(s.Out) // an empty folder, if any
	if err := os.Rename(s.Dir, s.Out); err != nil {
		return fmt.Errorf("rename %s to %s: %w", s.Dir, s.Out, err)
	}
	return nil
}

// Path maps a path inside the temporary folder to where it lies after Finish (unchanged
// before Finish, and for paths outside the stage).
func (s *Stage) Path(p string) string {
	if !s.done || s.final == "" {
		return p
	}
	rel, err := filepath.Rel(s.Dir, p)
	if err != nil || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
		return p
	}
	return filepath.Join(s.final, rel)
}

// Rebase points the result's run directories and plots at where Finish put them.
func (r *ProfileResult) Rebase(s *Stage) {
	for i := range r.Points {
		r.Points[i].Dir = s.Path(r.Points[i].Dir)
	}
	for i := range r.SweepPlots {
		r.SweepPlots[i] = s.Path(r.SweepPlots[i])
	}
}
