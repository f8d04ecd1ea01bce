// Command hparams prints the hyper-parameters the native runtime resolves from a checkpoint's
// config.json (native.Resolve), as JSON: what the lab's GPU drivers (fixtures/golden/
// llama_cuda_parity.py) hand libmodelqual_cuda.so, which never parses config.json itself.
//
//	go run ./lab/cuda/hparams FAMILY path/to/config.json > FAMILY.hparams.json
package main

import (
	"encoding/json"
	"fmt"
	"os"

	"github.com/modelqual/modelqual/native"
)

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: hparams FAMILY CONFIG.json")
		os.Exit(2)
	}
	raw, err := os.ReadFile(os.Args[2])
	if err != nil {
		fmt.Fprintln(os.Stderr, "hparams:", err)
		os.Exit(1)
	}
	hp, err := native.Resolve(os.Args[1], raw)
	if err != nil {
		fmt.Fprintln(os.Stderr, "hparams:", err)
		os.Exit(1)
	}
	out, _ := json.MarshalIndent(hp, "", " ")
	fmt.Println(string(out))
}
