package server

import (
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"os/signal"
	"runtime/debug"
	"strings"
	"syscall"
	"time"

	"github.com/modelqual/modelqual/server/cpuset"
	"github.com/modelqual/modelqual/server/envconfig"
)

// ParseFlags turns qual-server's command line into a Config. --help text is the reference
// for every flag.
func ParseFlags(args []string, errOut io.Writer) (Config, error) {
	var c Config
	fs := flag.NewFlagSet("qual-server", flag.ContinueOnError)
	fs.SetOutput(errOut)
	fs.Usage = func() {
		fmt.Fprint(errOut, `qual-server: OpenAI-compatible serving of one model bundle over native worker processes.

Usage: qual-server --bundle FILE.mqb --model-name NAME [flags]

Routes: GET /health, GET /v1/models, GET /v1/models/{model}, POST /v1/completions,
POST /v1/chat/completions, POST /v1/images/generations and POST /mq/v1/image_latents
(text-to-image bundles), POST /tokenize, POST /detokenize, POST /mq/v1/logits,
GET /mq/v1/bundle, GET /metrics.
With --grpc-port: the OpenEngine API v1 (gRPC) over the same engines, records and metrics.
SIGTERM drains: the port stays open and new requests (new connections too) get 503
shutting_down (gRPC: UNAVAILABLE); in-flight ones may finish until --drain-timeout, then are
ended by the server (streams with an error event, code drain_timeout; others 503) and recorded
with finish_reason "drain"; records are flushed; exit 0 (1 if a record could not be written).
Env MODELQUAL_FAULTS injects the faults documented in package server.

Flags:
`)
		fs.PrintDefaults()
	}
	fs.StringVar(&c.Bundle, "bundle", "", "bundle `FILE` to serve (built by qual bundle build; required)")
	fs.StringVar(&c.ModelName, "model-name", "", "model name clients send as \"model\" and /v1/models lists (required)")
	fs.StringVar(&c.Host, "host", "127.0.0.1", "address to listen on; 0.0.0.0 to accept remote clients (containers)")
	fs.IntVar(&c.Port, "port", 8000, "TCP port (0: any free port, printed in the log)")
	fs.IntVar(&c.GRPCPort, "grpc-port", -1, "also serve the OpenEngine API v1 over gRPC (openengine.v1 Inference and Control, grpc.health.v1, reflection) on this TCP port of --host (-1: off; 0: any free port)")
	fs.IntVar(&c.Workers, "workers", 1, "worker processes, one engine each")
	fs.IntVar(&c.MaxBatch, "max-batch", 0, "batch slots per engine (0: the bundle's build max_batch)")
	fs.IntVar(&c.QueueDepth, "queue-depth", 256, "requests that may wait for a batch slot; beyond it requests get 429")
	fs.DurationVar(&c.StartupTimeout, "startup-timeout", 5*time.Minute, "how long a worker may take to load its engine")
	fs.DurationVar(&c.RequestTimeout, "request-timeout", 0, "cancel a request that runs longer (0: no limit); streaming clients get an error event, others 504")
	fs.DurationVar(&c.DrainTimeout, "drain-timeout", 30*time.Second, "on SIGTERM, how long in-flight requests may run before they are cancelled")
	fs.StringVar(&c.Records, "records", "", "append one JSONL record per request to this file (no prompt or output text)")
	fs.StringVar(&c.APIKey, "api-key", "", "require Authorization: Bearer KEY on API routes and /debug/pprof (not /health, /metrics); visible in ps: prefer --api-key-file or env "+apiKeyEnv)
	apiKeyFile := fs.String("api-key-file", "", "read the API key from this file (one line; like --api-key)")
	fs.BoolVar(&c.Pprof, "pprof", false, "serve net/http/pprof under /debug/pprof/ (behind the API key when one is set)")
	fs.StringVar(&c.Device, "device", "cpu", "engine device: cpu or cuda")
	fs.IntVar(&c.Threads, "threads", 0, "engine threads per worker (0: all cores)")
	fs.Int64Var(&c.MaxBodyBytes, "max-body", 8<<20, "largest accepted request body in bytes (413 beyond)")
	fs.DurationVar(&c.BodyTimeout, "body-timeout", 30*time.Second, "a request body must arrive within this (408 and the connection closed beyond; 0: no limit)")
	fs.DurationVar(&c.WriteTimeout, "write-timeout", 30*time.Second, "each write to a client must complete within this, so a client that stops reading is cut; a stream the client reads may run as long as it generates (0: no limit)")
	fs.DurationVar(&c.IdleTimeout, "idle-timeout", 60*time.Second, "close a keep-alive connection idle this long (0: never)")
	fs.IntVar(&c.MaxMessages, "max-messages", 1024, "most messages in a chat request (400 beyond; 0: no limit)")
	fs.IntVar(&c.MaxChatBytes, "max-chat-bytes", 1<<20, "most bytes of message content in a chat request, all messages together (400 beyond; 0: no limit)")
	fs.IntVar(&c.MaxImages, "max-images-per-request", 1, "most images in one vision-language chat request, all messages together (400 beyond); more than 1 needs a model that takes several (internvl stacks their tiles; qwen3vl gives each its own grid; both on cpu and cuda)")
	fs.IntVar(&c.MaxConns, "max-conns", DefaultMaxConns, "most client connections open at once; a connection beyond gets 503 and is closed")
	cpus := func(flag string, dst *cpuset.Set) func(string) error {
		return func(v string) error {
			s, err := cpuset.Parse(v)
			if err != nil {
				return fmt.Errorf("%s: %w", flag, err)
			}
			*dst = s
			return nil
		}
	}
	fs.Func("frontend-cpus", "pin the HTTP frontend to these CPUs (a list such as 0-3,7; Linux); default: unpinned", cpus("--frontend-cpus", &c.FrontendCPUs))
	fs.Func("worker-cpus", "pin the worker processes (engines) to these CPUs; default: unpinned, or the CPUs the server started with when --frontend-cpus is set", cpus("--worker-cpus", &c.WorkerCPUs))
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("qual-server: unexpected arguments %q; every setting is a flag (see --help)", fs.Args())
	}
	key, err := resolveAPIKey(c.APIKey, *apiKeyFile)
	if err != nil {
		return c, err
	}
	c.APIKey = key
	return c, nil
}

// apiKeyEnv is the environment variable qual-server reads its API key from when neither
// --api-key nor --api-key-file is given (envconfig.ServerAPIKey). It is removed from the
// environment once read, so worker processes never carry it.
var apiKeyEnv = envconfig.ServerAPIKey.Name

// resolveAPIKey picks the API key from the flag, the file or the environment; giving more
// than one is an error rather than a silent precedence.
func resolveAPIKey(flagKey, file string) (string, error) {
	envKey, envSet := envconfig.ServerAPIKey.Lookup()
	os.Unsetenv(apiKeyEnv)
	n := 0
	for _, set := range []bool{flagKey != "", file != "", envSet} {
		if set {
			n++
		}
	}
	if n > 1 {
		return "", fmt.Errorf("qual-server: the API key is given more than once (--api-key, --api-key-file, %s); give it one way", apiKeyEnv)
	}
	key := flagKey
	switch {
	case file != "":
		b, err := os.ReadFile(file)
		if err != nil {
			return "", fmt.Errorf("qual-server: --api-key-file: %w", err)
		}
		key = strings.TrimRight(string(b), "\r\n")
		if key == "" || strings.ContainsAny(key, "\r\n") {
			return "", fmt.Errorf("qual-server: --api-key-file %s must hold the key on one non-empty line", file)
		}
	case envSet:
		if envKey == "" {
			return "", fmt.Errorf("qual-server: %s is set but empty; unset it or give a key", apiKeyEnv)
		}
		key = envKey
	}
	return key, nil
}

// Main runs qual-server until SIGTERM or SIGINT and returns the exit code.
func Main(args []string) int {
	log.SetFlags(log.LstdFlags | log.Lmicroseconds)
	if !envconfig.GOGC.IsSet() {
		// The frontend's live heap is small (tokenizer, a few KB per request) and its garbage
		// is per-request; collecting at 4× the live heap instead of 2× halves GC work on the
		// streaming path at a cost of some megabytes.
		debug.SetGCPercent(400)
	}
	log.SetPrefix("qual-server ")
	// Asked-for help goes to stdout with exit 0 (qual-server --help | less); usage after a
	// mistake goes to stderr with exit 2.
	usageOut := io.Writer(os.Stderr)
	for _, a := range args {
		if a == "-h" || a == "-help" || a == "--help" {
			usageOut = os.Stdout
		}
	}
	cfg, err := ParseFlags(args, usageOut)
	if err != nil {
		if err == flag.ErrHelp {
			return 0
		}
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	s, err := New(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	started := make(chan error, 1)
	go func() { started <- s.Start() }()
	select {
	case err := <-started:
		if err != nil {
			log.Print(err)
			_ = s.Shutdown(time.Second)
			return 1
		}
	case sig := <-sigs:
		log.Printf("%v while loading; stopping", sig)
		_ = s.Shutdown(time.Second)
		return 0
	}
	sig := <-sigs
	log.Printf("%v: draining (up to %v)", sig, cfg.DrainTimeout)
	if err := s.Shutdown(cfg.DrainTimeout); err != nil {
		log.Printf("records: %v", err)
		return 1
	}
	log.Print("drained; bye")
	return 0
}
