package spec

import (
	"fmt"

	"github.com/modelqual/modelqual/qual/recount"
)

// verifyRuns recomputes every figure of the load gate's run directories from their raw client
// records with qual/recount, code written apart from what reported them, and checks the server
// records in them against what the client received. It returns one line per run directory
// for the report and the problems (a mismatch names the figure, both values and the requests
// behind it).
func verifyRuns(dirs []string) (lines, problems []string) {
	for _, root := range dirs {
		runs, err := recount.RunDirs(root)
		if err != nil {
			problems = append(problems, "recount: "+err.Error())
			continue
		}
		for _, d := range runs {
			rep, err := recount.Verify(d)
			if err != nil {
				problems = append(problems, fmt.Sprintf("recount: %v", err))
				continue
			}
			lines = append(lines, rep.Summary())
			if err := rep.Err(); err != nil {
				problems = append(problems, "recount: "+err.Error())
			}
		}
	}
	return lines, problems
}
