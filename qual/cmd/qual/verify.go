package main

import (
	"flag"
	"fmt"
	"io"

	"github.com/modelqual/modelqual/qual/recount"
)

// reportVerify is `qual report verify RUN...`: every reported figure of each run directory
// recomputed from its raw client records (qual/recount) and compared, and the server's
// records checked against what the client received.
func reportVerify(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("qual report verify", flag.ContinueOnError)
	fs.SetOutput(stderr)
	notes := fs.Bool("notes", false, "also print what was not checked and why")
	fs.Usage = func() {
		fmt.Fprint(stderr, "Usage: qual report verify [--notes] RUN...\n\n"+
			"Recomputes every figure of each run directory (or of every run directory under a folder) from\n"+
			"its raw client records alone (client_records.jsonl: each request's send time, the arrival of\n"+
			"each content chunk, status and phase), apart from the code that reported them, and compares\n"+
			"summary.json, profile_export.jsonl, profile_export_aiperf.json and .csv to float precision\n"+
			"(the CSV to the decimals it is written with). The server's records must match what the client\n"+
			"received (status, usage, finish reason, PNG bytes and sha256), one record per request.\n\n"+
			"Exit status: 0 when everything agrees, 1 when a figure or record differs (each named with both\n"+
			"values and the request IDs behind it), 2 when a run cannot be read.\n\n")
		fs.PrintDefaults()
	}
	if code, ok := parseFlags(fs, args); !ok {
		return code
	}
	if fs.NArg() == 0 {
		fs.Usage()
		return 2
	}
	code := 0
	for _, arg := range fs.Args() {
		dirs, err := recount.RunDirs(arg)
		if err != nil {
			fmt.Fprintf(stderr, "qual report verify: %v\n", err)
			code = 2
			continue
		}
		for _, dir := range dirs {
			rep, err := recount.Verify(dir)
			if err != nil {
				fmt.Fprintf(stderr, "qual report verify: %v\n", err)
				code = 2
				continue
			}
			fmt.Fprintln(stdout, rep.Summary())
			if *notes {
				for _, n := range rep.Notes {
					fmt.Fprintf(stdout, "  note: %s\n", n)
				}
			}
			if err := rep.Err(); err != nil {
				fmt.Fprintf(stderr, "qual report verify: %v\n", err)
				code = max(code, 1)
			}
		}
	}
	return code
}
