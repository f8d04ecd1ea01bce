package main

import (
	"fmt"
	"os"
	"strings"

	"github.com/modelqual/modelqual/qual/load"
)

// profileFinish ends a staged `qual profile` run (load.StageRun): the run's temporary folder
// becomes --out when the run succeeded (code 0, runErr nil), else it is kept as
// <out>.failed-<time> with a FAILED note saying why, so a retry into the same --out is not
// blocked. It prints the summary table with the run directories where they now lie and
// returns the exit code (1 when the folder could not be put in place).
func profileFinish(stage *load.Stage, res *load.ProfileResult, runErr error, code int) int {
	if runErr == nil && code != 0 {
		runErr = fmt.Errorf("qual profile exited with status %d before the run ended (its messages above say why)", code)
	}
	final, err := stage.Finish(runErr)
	if res != nil {
		res.Rebase(stage)
		printProfileSummary(os.Stdout, res)
		if fm := res.FindMax; fm != nil {
			for i, p := range fm.Points {
				res := "pass"
				if !p.Pass {
					res = "FAIL: " + strings.Join(p.Failed, "; ")
				}
				fmt.Fprintf(os.Stdout, "find-max point %d: %s=%s %s\n", i+1, fm.Parameter, fm.ValueText(p.Value), res)
			}
			fmt.Fprintf(os.Stdout, "find-max: %s\n", fm.Verdict)
		}
		for _, p := range res.SweepPlots {
			fmt.Fprintf(os.Stdout, "sweep plot: %s\n", p)
		}
		for _, n := range res.Notes {
			fmt.Fprintf(os.Stdout, "note: %s\n", n)
		}
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "qual profile: %v\n", err)
		if code == 0 {
			code = 1
		}
	}
	if runErr != nil {
		fmt.Fprintf(os.Stderr, "qual profile: the run failed; it is kept in %s (%s says why), and %s stays free for the next run\n",
			final, load.FailedFile, stage.Out)
		if code == 0 {
			code = 1
		}
	}
	return code
}
