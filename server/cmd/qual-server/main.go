// Command qual-server serves one model bundle over an OpenAI-compatible HTTP API. Run with
// --help for flags. `qual-server worker ...` is the hidden worker mode the server starts for
// each engine; it speaks the protocol of package server/wire on inherited pipes.
package main

import (
	"os"

	"github.com/modelqual/modelqual/server"
	"github.com/modelqual/modelqual/server/worker"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == server.WorkerCommand {
		os.Exit(worker.Main(os.Args[2:]))
	}
	os.Exit(server.Main(os.Args[1:]))
}
