package worker

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/modelqual/modelqual/native"
	"github.com/modelqual/modelqual/native/bundle"
	"github.com/modelqual/modelqual/server/cpuset"
	"github.com/modelqual/modelqual/server/wire"
)

// nativeEngine adapts *native.Engine to Engine.
type nativeEngine struct {
	e  *native.Engine
	fn func(Event)
	cb func(native.Event) // bound once, so Step allocates no closure per step
}

func newNativeEngine(e *native.Engine) *nativeEngine {
	n := &nativeEngine{e: e}
	n.cb = func(ev native.Event) {
		out := Event{Seq: uint64(ev.Seq), Token: ev.Token, Done: ev.Done}
		if ev.HasLogprob {
			lp := &wire.Logprobs{Logprob: ev.Logprob, Rank: uint32(ev.Rank), Top: make([]wire.Candidate, len(ev.Top))}
			for i, c := range ev.Top {
				lp.Top[i] = wire.Candidate{ID: c.ID, Logprob: c.Logprob}
			}
			out.Logprobs = lp
		}
		if ev.Done {
			out.Reason = reasonOf(ev.Reason)
			out.AddedNs, out.FirstTokenNs, out.DoneNs = ev.Timing.AddedNs, ev.Timing.FirstTokenNs, ev.Timing.DoneNs
			out.PromptTokens, out.OutputTokens = ev.Timing.PromptTokens, ev.Timing.OutputTokens
			out.VisionNs = ev.Timing.VisionNs
		}
		n.fn(out)
	}
	return n
}

func reasonOf(r native.FinishReason) wire.Reason {
	switch r {
	case native.FinishStop:
		return wire.ReasonStop
	case native.FinishLength:
		return wire.ReasonLength
	case native.FinishCancelled:
		return wire.ReasonCancelled
	}
	return wire.ReasonError
}

func (n *nativeEngine) Add(prompt []int32, s wire.Sampling) (uint64, error) {
	id, err := n.e.Add(prompt, nativeSampling(s))
	if errors.Is(err, native.ErrBatchFull) {
		return 0, ErrBatchFull
	}
	return uint64(id), err
}

// nativeImages is a prompt's images as the engine takes them: one (stacked or single), or each
// on its own grid.
func nativeImages(im *wire.ImageInput) ([]*native.Image, error) {
	grids, pixels, err := im.Split()
	if err != nil {
		return nil, err
	}
	out := make([]*native.Image, len(grids))
	for k, g := range grids {
		out[k] = &native.Image{Pixels: pixels[k], Grid: [3]int{int(g[0]), int(g[1]), int(g[2])}}
	}
	return out, nil
}

// AddImage is Add with a vision-language prompt's images.
func (n *nativeEngine) AddImage(prompt []int32, im *wire.ImageInput, s wire.Sampling) (uint64, error) {
	ims, err := nativeImages(im)
	if err != nil {
		return 0, err
	}
	id, err := n.e.AddImages(prompt, ims, nativeSampling(s))
	if errors.Is(err, native.ErrBatchFull) {
		return 0, ErrBatchFull
	}
	return uint64(id), err
}

// LogitsImage is Logits with a vision-language prompt's images.
func (n *nativeEngine) LogitsImage(ids []int32, im *wire.ImageInput) ([]float32, error) {
	ims, err := nativeImages(im)
	if err != nil {
		return nil, err
	}
	return n.e.LogitsImages(ids, ims)
}

func (n *nativeEngine) Cancel(seq uint64) { n.e.Cancel(native.SeqID(seq)) }

func (n *nativeEngine) Step(fn func(Event)) (int, error) {
	n.fn = fn
	return n.e.Step(n.cb)
}

// Routing is the engine's mixture-of-experts routing counts (nil for a dense model).
func (n *nativeEngine) Routing() ([][]uint64, error) { return n.e.Routing() }

func (n *nativeEngine) Active() int                           { return n.e.Active() }
func (n *nativeEngine) Logits(ids []int32) ([]float32, error) { return n.e.Logits(ids) }
func (n *nativeEngine) Close() error                          { return n.e.Close() }

// Protocol file descriptors the frontend passes to a worker (exec.Cmd.ExtraFiles).
const (
	fdIn  = 3
	fdOut = 4
)

// Main is `qual-server worker ...`: open the bundle and one native engine, then serve the wire
// protocol on fds 3 (in) and 4 (out) until the frontend closes fd 3. Not meant to be run by
// hand; the frontend starts it.
func Main(args []string) int {
	log.SetPrefix(fmt.Sprintf("qual-server worker[%d] ", os.Getpid()))
	fs := flag.NewFlagSet("qual-server worker", flag.ContinueOnError)
	path := fs.String("bundle", "", "bundle file")
	device := fs.String("device", "cpu", "cpu or cuda")
	threads := fs.Int("threads", 0, "engine threads (0: all cores)")
	maxBatch := fs.Int("max-batch", 0, "batch slots (0: the bundle's build setting)")
	cpus := fs.String("cpus", "", "pin this worker and its engine's threads to these CPUs (the frontend's --worker-cpus)")
	var verified bundle.Verified
	fs.TextVar(&verified, "bundle-verified", bundle.Verified{}, "the frontend's verification of the bundle (map it without hashing); empty: hash it here")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	// The pipes arrive in blocking mode (os/exec hands the child blocking descriptors). In
	// non-blocking mode os.NewFile puts them in Go's poller; otherwise every read is a blocking
	// system call that holds this process's one P (GOMAXPROCS = its CPUs) until sysmon takes
	// it back, and the step loop, readied by the command just read, waited 100-200 us for it:
	// most of a new request's time to first token under load.
	// Both must be pipes: run by hand, fds 3 and 4 are closed or (Go's runtime opens its own
	// descriptors at start) something else, and os.NewFile accepts any descriptor number.
	for _, fd := range []int{fdIn, fdOut} {
		var st syscall.Stat_t
		if err := syscall.Fstat(fd, &st); err != nil || st.Mode&syscall.S_IFMT != syscall.S_IFIFO {
			log.Printf("worker mode needs the protocol pipes on fds 3 and 4 (fd %d is not a pipe); it is started by qual-server, not by hand", fd)
			return 2
		}
		if err := syscall.SetNonblock(fd, true); err != nil {
			log.Printf("worker: fd %d: %v", fd, err)
			return 2
		}
	}
	in := os.NewFile(fdIn, "frontend-in")
	out := os.NewFile(fdOut, "frontend-out")
	// The frontend coordinates shutdown (EOF on fd 3) and SIGTERM drain; a terminal's Ctrl-C
	// reaching the whole process group must not kill engines under in-flight requests.
	signal.Ignore(syscall.SIGINT, syscall.SIGTERM, syscall.SIGPIPE)

	if *cpus != "" {
		// Before the engine starts its threads, which inherit the mask.
		set, err := cpuset.Parse(*cpus)
		if err == nil {
			err = cpuset.Pin(set)
		}
		if err != nil {
			return fatal(out, fmt.Errorf("--worker-cpus: %w", err))
		}
		cpuset.MatchGOMAXPROCS(set)
		if *threads == 0 {
			*threads = len(set) // "all cores" of the placement, not of the machine
		}
	}
	start := time.Now()
	eng, info, err := open(*path, verified, native.Params{Threads: *threads, MaxBatch: *maxBatch, Device: *device})
	if err != nil {
		return fatal(out, err)
	}
	info.LoadNs = int64(time.Since(start))
	if err := Serve(eng, info, in, out); err != nil && !errors.Is(err, io.ErrClosedPipe) && !errors.Is(err, syscall.EPIPE) {
		log.Printf("serve: %v", err)
		return 1
	}
	return 0
}

// fatal tells the frontend why this worker cannot serve (its hello is a Fatal frame), logs it
// and returns the exit code.
func fatal(out io.Writer, err error) int {
	w := wire.NewWriter(out)
	w.Fatal(err.Error())
	_ = w.Flush()
	log.Print(err)
	return 1
}

func open(path string, v bundle.Verified, p native.Params) (Engine, wire.Info, error) {
	if path == "" {
		return nil, wire.Info{}, errors.New("worker: --bundle is required")
	}
	b, err := openBundle(path, v)
	if err != nil {
		return nil, wire.Info{}, fmt.Errorf("worker: open bundle: %w", err)
	}
	e, err := native.Open(b, p)
	if err != nil {
		b.Close()
		return nil, wire.Info{}, fmt.Errorf("worker: open engine on %s: %w", path, err)
	}
	ni := e.Info()
	info := wire.Info{
		PID: os.Getpid(), Family: ni.Family, VocabSize: ni.VocabSize, MaxContext: ni.MaxContext,
		MaxBatch: ni.MaxBatch, EOSIDs: ni.EOSIDs, Device: ni.Device, StepDelayNs: int64(ni.StepDelay),
		BundleDigest: b.Digest(),
	}
	return &closingEngine{nativeEngine: newNativeEngine(e), b: b}, info, nil
}

// openBundle maps the bundle without hashing it when the frontend verified it (v, from
// --bundle-verified) and the file is still the one it verified. A file changed since then is
// hashed here (bundle.Open refuses a corrupt one); the frontend then refuses this worker if the
// digest is no longer the one it serves. Without v (a worker run by hand) it hashes.
func openBundle(path string, v bundle.Verified) (*bundle.Bundle, error) {
	if v.SHA256 == "" {
		return bundle.Open(path)
	}
	b, err := bundle.OpenVerified(path, v)
	if errors.Is(err, bundle.ErrChanged) {
		log.Printf("%v; hashing it again", err)
		return bundle.Open(path)
	}
	if err == nil {
		log.Printf("mapped bundle %s without hashing it: the frontend verified it (digest %s)", path, v.SHA256)
	}
	return b, err
}

// closingEngine also unmaps the bundle when the engine closes.
type closingEngine struct {
	*nativeEngine
	b *bundle.Bundle
}

func (c *closingEngine) Close() error {
	err := c.nativeEngine.Close()
	if cerr := c.b.Close(); err == nil {
		err = cerr
	}
	return err
}

// nativeSampling is the engine's form of a Submit frame's sampling controls.
func nativeSampling(s wire.Sampling) native.Sampling {
	return native.Sampling{
		MaxNewTokens: int(s.MaxNewTokens), Temperature: s.Temperature, TopK: int(s.TopK),
		TopP: s.TopP, Seed: s.Seed, IgnoreEOS: s.IgnoreEOS, Logprobs: s.Logprobs, TopLogprobs: int(s.TopLogprobs),
		RepetitionPenalty: s.RepetitionPenalty, PresencePenalty: s.PresencePenalty,
		FrequencyPenalty: s.FrequencyPenalty, MinP: s.MinP, MinTokens: int(s.MinTokens),
	}
}
