package spec

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/onsi/ginkgo/v2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/modelqual/modelqual/qual/records"
	oe "github.com/modelqual/modelqual/server/openengine/v1"
)

// RecordCheckInput is the input of RecordsMatchResponses and CheckRecordsMatchResponses: the
// routes a family serves and a request for each.
type RecordCheckInput struct {
	// API reaches the served model; RecordsPath is its server's records file.
	API         *API
	RecordsPath string
	// Prompt is a raw-text prompt for /v1/completions (empty: the family serves no text
	// completions).
	Prompt string
	// Messages is a conversation for /v1/chat/completions (nil: no chat).
	Messages []map[string]any
	// VisionImage is an image file sent with VisionText as one chat message (empty: no
	// vision-language chat).
	VisionImage, VisionText string
	// Image is an image-generation request for /v1/images/generations (nil: none).
	Image *ImageRequest
	// GRPCAddr is an OpenEngine v1 gRPC port serving Prompt, whose server writes
	// GRPCRecordsPath (empty: no gRPC).
	GRPCAddr, GRPCRecordsPath string
	// MaxTokens per text answer.
	MaxTokens int
}

// sentRequest is one request of the gate and what its record must say.
type sentRequest struct {
	what    string // "POST /v1/completions stream", ...
	records string // the records file its server writes
	id      string
	want    map[string]string // record field → what the client received
}

func hexSHA(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// CheckRecordsMatchResponses is RecordsMatchResponses' core; it returns what it checked, one
// line per request. It sends, on every route in the
// input, streamed and not where the route streams, one request that succeeds and one the
// server refuses, and requires that each leaves exactly one server record whose fields equal
// what the client received: the request ID (sent, echoed, in the response id); the route,
// status, streaming and, on refusal, the error type; the prompt and completion token counts
// of the usage; the finish reason; the sha256 and byte count of the text answered (a
// stream's deltas joined) or of the PNG; the prompt's sha256 and bytes where the route takes
// raw text; the image's sha256 for a vision request; the controls of an image request; and
// gRPC's Usage, text and finish reason.
func CheckRecordsMatchResponses(ctx context.Context, in RecordCheckInput) ([]string, error) {
	const fn = "spec.CheckRecordsMatchResponses"
	switch {
	case in.API == nil:
		return nil, fmt.Errorf("%s: RecordCheckInput.API is nil", fn)
	case in.RecordsPath == "":
		return nil, fmt.Errorf("%s: RecordCheckInput.RecordsPath is empty: the server's records are what this gate checks", fn)
	case in.Prompt == "" && in.Messages == nil && in.VisionImage == "" && in.Image == nil:
		return nil, fmt.Errorf("%s: RecordCheckInput names no route (Prompt, Messages, VisionImage or Image)", fn)
	case in.MaxTokens < 1 && (in.Prompt != "" || in.Messages != nil || in.VisionImage != ""):
		return nil, fmt.Errorf("%s: RecordCheckInput.MaxTokens %d must be at least 1", fn, in.MaxTokens)
	case in.GRPCAddr != "" && (in.GRPCRecordsPath == "" || in.Prompt == ""):
		return nil, fmt.Errorf("%s: RecordCheckInput.GRPCAddr needs GRPCRecordsPath and Prompt", fn)
	}
	var sent []sentRequest
	var problems []string
	text := func(route string, body map[string]any, stream bool, promptRaw string, extra map[string]string) {
		b := map[string]any{"max_tokens": in.MaxTokens, "temperature": 0, "stream": stream}
		for k, v := range body {
			b[k] = v
		}
		what := "POST " + route
		if stream {
			b["stream_options"] = map[string]any{"include_usage": true}
			what += " stream"
		}
		id := newRequestID("record-check")
		ans, err := in.API.CompleteID(ctx, route, id, b)
		if err != nil {
			problems = append(problems, fmt.Sprintf("%s (request %s): %v", what, id, err))
			return
		}
		if !ans.HasUsage {
			problems = append(problems, fmt.Sprintf("%s (request %s): the answer has no usage to check the record against", what, id))
		}
		if ans.RequestID != id {
			problems = append(problems, fmt.Sprintf("%s: sent X-Request-Id %s, the response says %q", what, id, ans.RequestID))
		}
		if !strings.HasSuffix(ans.ID, id) {
			problems = append(problems, fmt.Sprintf("%s: the response id %q is not the request's (%s)", what, ans.ID, id))
		}
		want := map[string]string{"route": route, "status": "200", "stream": fmt.Sprint(stream), "error_type": "",
			"input_tokens": fmt.Sprint(ans.PromptTokens), "output_tokens": fmt.Sprint(ans.CompletionTokens),
			"finish_reason": ans.FinishReason, "output_sha256": hexSHA([]byte(ans.Text)), "output_bytes": fmt.Sprint(len(ans.Text))}
		if promptRaw != "" {
			want["prompt_sha256"], want["prompt_bytes"] = hexSHA([]byte(promptRaw)), fmt.Sprint(len(promptRaw))
		}
		for k, v := range extra {
			want[k] = v
		}
		sent = append(sent, sentRequest{what: what, records: in.RecordsPath, id: id, want: want})
	}
	refused := func(route string, body map[string]any, field string) {
		id := newRequestID("record-check-refused")
		var err error
		if route == "/v1/images/generations" {
			_, err = in.API.GenerateImageID(ctx, id, body)
		} else {
			_, err = in.API.CompleteID(ctx, route, id, body)
		}
		var ae *APIError
		if !errors.As(err, &ae) || ae.Status != 400 {
			problems = append(problems, fmt.Sprintf("POST %s with %s: want HTTP 400, got %v", route, field, err))
			return
		}
		sent = append(sent, sentRequest{what: fmt.Sprintf("POST %s refused (%s)", route, field), records: in.RecordsPath, id: id,
			want: map[string]string{"route": route, "status": "400", "error_type": ae.Type}})
	}
	for _, stream := range []bool{false, true} {
		if in.Prompt != "" {
			text("/v1/completions", map[string]any{"prompt": in.Prompt}, stream, in.Prompt, nil)
		}
		if in.Messages != nil {
			text("/v1/chat/completions", map[string]any{"messages": in.Messages}, stream, "", nil)
		}
		if in.VisionImage != "" {
			url, err := ImageDataURL(in.VisionImage)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", fn, err)
			}
			raw, err := os.ReadFile(in.VisionImage)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", fn, err)
			}
			text("/v1/chat/completions", map[string]any{"messages": []any{ImageMessage(url, in.VisionText)}}, stream, "",
				map[string]string{"vision.image_bytes_sha256": hexSHA(raw)})
		}
	}
	if in.Prompt != "" {
		refused("/v1/completions", map[string]any{"prompt": in.Prompt, "max_tokens": in.MaxTokens, "best_of": 2}, "best_of: 2")
	}
	if in.Messages != nil || in.VisionImage != "" {
		msgs := in.Messages
		if msgs == nil {
			msgs = []map[string]any{{"role": "user", "content": in.VisionText}}
		}
		for _, c := range DefaultRefusedControls() {
			if c.Route == "/v1/chat/completions" {
				refused(c.Route, map[string]any{"messages": msgs, "max_tokens": in.MaxTokens, c.Field: c.Value}, c.Field)
				break
			}
		}
	}
	if r := in.Image; r != nil {
		id := newRequestID("record-check")
		body := r.Body(in.API.Model)
		ans, err := in.API.GenerateImageID(ctx, id, body)
		if err != nil {
			problems = append(problems, fmt.Sprintf("POST /v1/images/generations (request %s): %v", id, err))
		} else {
			sent = append(sent, sentRequest{what: "POST /v1/images/generations", records: in.RecordsPath, id: id, want: map[string]string{
				"route": "/v1/images/generations", "status": "200", "error_type": "",
				"output_sha256": hexSHA(ans.PNG), "output_bytes": fmt.Sprint(len(ans.PNG)),
				"image.png_sha256": hexSHA(ans.PNG), "image.png_bytes": fmt.Sprint(len(ans.PNG)),
				"image.width": fmt.Sprint(r.Width), "image.height": fmt.Sprint(r.Height), "image.steps": fmt.Sprint(r.Steps),
				"image.guidance": fmt.Sprint(r.Guidance), "image.seed": fmt.Sprint(r.Seed),
				"prompt_sha256": hexSHA([]byte(r.Prompt)), "prompt_bytes": fmt.Sprint(len(r.Prompt))}})
		}
		for _, r := range imageRefusals(body, 16) {
			if r.Field == "n" {
				refused("/v1/images/generations", r.Body, "n: 2")
				break
			}
		}
	}
	if in.GRPCAddr != "" {
		s, err := grpcRecordRequest(ctx, in)
		if err != nil {
			problems = append(problems, err.Error())
		} else {
			sent = append(sent, *s)
		}
	}
	problems = append(problems, compareRecords(ctx, sent)...)
	checked := make([]string, len(sent))
	for i, s := range sent {
		checked[i] = fmt.Sprintf("%s (request %s): %d fields", s.what, s.id, len(s.want))
	}
	if len(problems) > 0 {
		return checked, fmt.Errorf("record gate: %d requests sent; the server's records disagree with what the client received:\n  %s", len(sent), strings.Join(problems, "\n  "))
	}
	return checked, nil
}

// grpcRecordRequest sends one OpenEngine Generate of in.Prompt with its request ID.
func grpcRecordRequest(ctx context.Context, in RecordCheckInput) (*sentRequest, error) {
	conn, err := grpc.NewClient(in.GRPCAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("gRPC %s: %w", in.GRPCAddr, err)
	}
	defer conn.Close()
	id := newRequestID("record-check-grpc")
	temp, n := 0.0, uint32(in.MaxTokens)
	req := &oe.GenerateRequest{Model: in.API.Model, RequestId: id, Input: &oe.GenerateRequest_Prompt{Prompt: in.Prompt},
		Sampling: &oe.SamplingParams{Temperature: &temp}, Stopping: &oe.StoppingOptions{MaxTokens: &n}}
	ans, err := GenerateGRPCRequest(ctx, conn, req, -1)
	if err != nil {
		return nil, fmt.Errorf("gRPC Generate (request %s): %w", id, err)
	}
	if !ans.HasUsage {
		return nil, fmt.Errorf("gRPC Generate (request %s): the stream carried no Usage to check the record against", id)
	}
	return &sentRequest{what: "gRPC Generate", records: in.GRPCRecordsPath, id: id, want: map[string]string{
		"endpoint": "grpc", "error_type": "", "input_tokens": fmt.Sprint(ans.PromptTokens), "output_tokens": fmt.Sprint(ans.CompletionTokens),
		"finish_reason": ans.FinishReason, "output_sha256": hexSHA([]byte(ans.Text)), "output_bytes": fmt.Sprint(len(ans.Text)),
		"prompt_sha256": hexSHA([]byte(in.Prompt)), "prompt_bytes": fmt.Sprint(len(in.Prompt))}}, nil
}

// compareRecords waits for every sent request's record and compares the fields.
func compareRecords(ctx context.Context, sent []sentRequest) []string {
	byFile := map[string][]string{}
	for _, s := range sent {
		byFile[s.records] = append(byFile[s.records], s.id)
	}
	got := map[string][]records.Server{}
	var problems []string
	for path, ids := range byFile {
		recs, err := waitRecords(ctx, path, ids)
		if err != nil {
			problems = append(problems, err.Error())
		}
		for id, r := range recs {
			got[id] = r
		}
	}
	for _, s := range sent {
		rs := got[s.id]
		if len(rs) != 1 {
			problems = append(problems, fmt.Sprintf("%s (request %s): %d server records, want exactly one", s.what, s.id, len(rs)))
			continue
		}
		have := recordFields(&rs[0])
		for _, k := range keys(s.want) {
			if have[k] != s.want[k] {
				problems = append(problems, fmt.Sprintf("%s (request %s): record %s %q, the client received %q", s.what, s.id, k, have[k], s.want[k]))
			}
		}
	}
	return problems
}

// recordFields writes a record's compared fields as the client's values are written.
func recordFields(r *records.Server) map[string]string {
	m := map[string]string{
		"request_id": r.RequestID, "route": r.Route, "endpoint": r.Endpoint, "status": fmt.Sprint(r.Status), "stream": fmt.Sprint(r.Stream),
		"error_type": r.ErrorType, "input_tokens": fmt.Sprint(r.InputTokens), "output_tokens": fmt.Sprint(r.OutputTokens),
		"finish_reason": r.FinishReason, "output_sha256": r.OutputSHA256, "output_bytes": fmt.Sprint(r.OutputBytes),
		"prompt_sha256": r.PromptSHA256, "prompt_bytes": fmt.Sprint(r.PromptBytes),
	}
	if i := r.Image; i != nil {
		m["image.png_sha256"], m["image.png_bytes"] = i.PNGSHA256, fmt.Sprint(i.PNGBytes)
		m["image.width"], m["image.height"], m["image.steps"] = fmt.Sprint(i.Width), fmt.Sprint(i.Height), fmt.Sprint(i.Steps)
		m["image.guidance"], m["image.seed"] = fmt.Sprint(i.Guidance), fmt.Sprint(i.Seed)
	}
	if v := r.Vision; v != nil {
		m["vision.image_bytes_sha256"] = v.BytesSHA256
	}
	return m
}

// RecordsMatchResponses asserts that every request leaves exactly one server record and that
// the record says what the client received, on every route of the family
// (CheckRecordsMatchResponses).
func RecordsMatchResponses(ctx context.Context, input func() RecordCheckInput) {
	ginkgo.It("leaves exactly one server record per request, equal to what the client received (ids, status, usage, finish reason, text and PNG sha256 and bytes, gRPC Usage) on every route", Gate(GateContract), func(sctx ginkgo.SpecContext) {
		c, cancel := specContext(ctx, sctx)
		defer cancel()
		checked, err := CheckRecordsMatchResponses(c, input())
		ginkgo.AddReportEntry("records checked against responses", strings.Join(checked, "\n"))
		passGate(err)
	})
}

// RecordCheckInput is the record gate's input for this suite, from the manifest's tasks: a
// raw-text prompt of the corpus for a text family (and, on the process launcher, a CPU server
// of the bundle with --grpc-port for gRPC), a chat conversation of the corpus (or the first
// prompt as one user message) for a chat family, the first corpus image for a vision family,
// the first golden case for an image family. Under a launcher whose records the harness
// cannot read the spec skips.
func (s *Suite) RecordCheckInput() RecordCheckInput {
	ginkgo.GinkgoHelper()
	if s.State.RecordsPath == "" {
		ginkgo.Skip(fmt.Sprintf("%sthe record gate reads the server's request records; the %s launcher has none", NotCheckable, s.State.Launcher))
	}
	in := RecordCheckInput{API: s.API, RecordsPath: s.State.RecordsPath, MaxTokens: 8}
	has := map[string]bool{}
	for _, t := range s.Manifest.Tasks {
		has[t] = true
	}
	var raw *Prompt
	for i := range s.Corpus {
		p := &s.Corpus[i]
		switch {
		case p.Image != "":
			if has[TaskVision] && in.VisionImage == "" {
				in.VisionImage, in.VisionText = filepath.Join(s.State.RepoRoot, p.Image), p.Prompt
			}
		case p.IsChat():
			if has[TaskChat] && in.Messages == nil {
				in.Messages = p.Messages
			}
		case raw == nil:
			raw = p
		}
	}
	if has[TaskText] && raw != nil {
		in.Prompt = raw.Prompt
	}
	if has[TaskChat] && in.Messages == nil && raw != nil {
		in.Messages = []map[string]any{{"role": "user", "content": raw.Prompt}}
	}
	if has[TaskImage] {
		golden := s.ImageInput().Golden
		if len(golden) > 0 {
			r := golden[0].ImageRequest
			in.Image = &r
		}
	}
	if in.Prompt != "" && s.State.Bundle != "" && s.State.Launcher == "process" && s.State.Device != "cuda" {
		_, addr, ep := s.startGRPCServer("record-check-grpc")
		in.GRPCAddr, in.GRPCRecordsPath = addr, ep.RecordsPath
	}
	return in
}
