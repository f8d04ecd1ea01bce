package recount

import (
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// routes maps a client record's endpoint to the server route its requests take.
var routes = map[string]string{
	"completions": "/v1/completions",
	"chat":        "/v1/chat/completions",
	"grpc":        "/openengine.v1.Inference/Generate",
}

// requestIDs lists the request IDs of client records, in order.
func requestIDs[T interface{ requestID() string }](recs []T) []string {
	ids := make([]string, len(recs))
	for i := range recs {
		ids[i] = recs[i].requestID()
	}
	return ids
}

func (c clientRecord) requestID() string      { return c.RequestID }
func (c imageClientRecord) requestID() string { return c.RequestID }

// matchRecords checks that every client request has exactly one server record and every
// server record one client request; it returns the server record of each client ID that
// has exactly one.
func matchRecords(ids []string, server []serverRecord, rep *Report) map[string]*serverRecord {
	count := map[string]int{}
	byID := map[string]*serverRecord{}
	for i := range server {
		count[server[i].RequestID]++
		byID[server[i].RequestID] = &server[i]
	}
	sent := map[string]int{}
	var missing, dupServer, dupClient []string
	for _, id := range ids {
		sent[id]++
		switch {
		case sent[id] == 2:
			dupClient = append(dupClient, id)
		case sent[id] > 2:
		case count[id] == 0:
			missing = append(missing, id)
		case count[id] > 1:
			dupServer = append(dupServer, id)
		}
	}
	var orphan []string
	for id := range count {
		if sent[id] == 0 {
			orphan = append(orphan, id)
		}
	}
	rep.Checked += len(ids)
	for _, p := range []struct {
		what     string
		ids      []string
		got, exp string
	}{
		{"requests sent without a server record", missing, "no record", "one record each"},
		{"requests with several server records", dupServer, "several records", "one record each"},
		{"request IDs sent twice", dupClient, "sent twice", "unique request IDs"},
		{"server records of no request sent", orphan, "a record", "no such request"},
	} {
		if len(p.ids) == 0 {
			continue
		}
		sort.Strings(p.ids)
		rep.add(Mismatch{Figure: fmt.Sprintf("%s: %d %s", serverRecordsFile, len(p.ids), p.what), Reported: p.got, Recomputed: p.exp, Records: p.ids})
	}
	out := map[string]*serverRecord{}
	for _, id := range ids {
		if sent[id] == 1 && count[id] == 1 {
			out[id] = byID[id]
		}
	}
	return out
}

// field compares one field of a server record (key, as the records name it) with what the
// client received; a record without the field is noted, not compared.
func field(rep *Report, s *serverRecord, id, key string, record, client any) {
	name := key
	if i := strings.IndexByte(key, ' '); i >= 0 {
		key = key[:i] // "input_tokens (usage.prompt_tokens)"
	}
	if !s.has[key] {
		rep.noteOnce("%s: the records lack %s; not checked", serverRecordsFile, key)
		return
	}
	rep.Checked++
	if fmt.Sprint(record) != fmt.Sprint(client) {
		rep.add(Mismatch{Figure: fmt.Sprintf("%s %s %s", serverRecordsFile, id, name), Reported: fmt.Sprint(record),
			Recomputed: fmt.Sprint(client), Records: []string{id}, group: serverRecordsFile + " " + name, response: true})
	}
}

// checkTextRecords checks the text layout's server records against the client's: one record
// per request; the route and streaming of what was sent; and for every request answered, the
// status, and for every request that succeeded, the usage the client received (prompt and
// completion tokens) and the finish reason.
func checkTextRecords(client []clientRecord, server []serverRecord, rep *Report) {
	sv := matchRecords(requestIDs(client), server, rep)
	for i := range client {
		c := &client[i]
		s := sv[c.RequestID]
		if s == nil {
			continue
		}
		if want, ok := routes[c.Endpoint]; ok {
			field(rep, s, c.RequestID, "route", s.Route, want)
		}
		if c.Endpoint != "grpc" {
			field(rep, s, c.RequestID, "stream", s.Stream, c.Stream)
		}
		answered := c.HTTPStatus != 0 && !c.Cancelled
		if c.Error == nil && !c.Cancelled || answered && c.HTTPStatus >= 400 {
			field(rep, s, c.RequestID, "status", s.Status, c.HTTPStatus)
		}
		if c.Error != nil || c.Cancelled {
			continue
		}
		if c.InputTokensServer > 0 || c.OutputTokensServer > 0 {
			field(rep, s, c.RequestID, "input_tokens (usage.prompt_tokens)", s.InputTokens, c.InputTokensServer)
			field(rep, s, c.RequestID, "output_tokens (usage.completion_tokens)", s.OutputTokens, c.OutputTokensServer)
		}
		if c.FinishReason != "" {
			field(rep, s, c.RequestID, "finish_reason", s.FinishReason, c.FinishReason)
		}
	}
}

// imageClientRecord is one line of client_records.jsonl of an image run. Runs written since
// image records took the text records' format give the phase, end_ns (send to the end of
// the body), http_status, the error as code and type, and num_images; earlier ones gave a
// warmup flag, latency_ns and status, read by the methods below alike.
type imageClientRecord struct {
	RequestID   string `json:"request_id"`
	StartUnixNs int64  `json:"start_unix_ns"`
	AckNs       int64  `json:"ack_ns"`

	Phase      string        `json:"phase"`
	EndNs      int64         `json:"end_ns"`
	HTTPStatus int           `json:"http_status"`
	NumImages  int           `json:"num_images"`
	Failure    *imageFailure `json:"-"` // "error": nil when an image was received

	// The earlier format's fields.
	Warmup    bool  `json:"warmup"`
	LatencyNs int64 `json:"latency_ns"`
	Status    int   `json:"status"`

	PNGSHA256 string  `json:"png_sha256"`
	PNGBytes  int64   `json:"png_bytes"`
	Size      string  `json:"size"`
	Steps     int     `json:"num_inference_steps"`
	Guidance  float64 `json:"guidance_scale"`
	Seed      int64   `json:"seed"`

	legacy bool // the earlier format: its error was a message only
}

// UnmarshalJSON reads either format: "error" is an object {code, type, message} in the
// text records' format and a string in the earlier one.
func (c *imageClientRecord) UnmarshalJSON(b []byte) error {
	type plain imageClientRecord
	var aux struct {
		*plain
		Error json.RawMessage `json:"error"`
	}
	aux.plain = (*plain)(c)
	if err := json.Unmarshal(b, &aux); err != nil {
		return err
	}
	c.legacy = c.Phase == ""
	if c.legacy {
		c.Phase, c.EndNs, c.HTTPStatus = phaseProfiling, c.LatencyNs, c.Status
		if c.Warmup {
			c.Phase = phaseWarmup
		}
		if c.Status == 200 {
			c.NumImages = 1
		}
	}
	if len(aux.Error) > 0 && string(aux.Error) != "null" {
		var f imageFailure
		if err := json.Unmarshal(aux.Error, &f); err != nil {
			var msg string
			if json.Unmarshal(aux.Error, &msg) != nil {
				return fmt.Errorf("error: neither an object {code, type, message} nor a string: %s", aux.Error)
			}
			f.Message = msg
		}
		if c.legacy {
			f.Code, f.Type = c.Status, "http_error"
			if c.Status == 0 {
				f.Type = "no_response"
			}
		}
		c.Failure = &f
	}
	if c.legacy && c.Status != 200 && c.Failure == nil {
		c.Failure = &imageFailure{Code: c.Status, Type: "no_response"}
		if c.Status != 0 {
			c.Failure.Type = "http_error"
		}
	}
	return nil
}

// imageFailure is why an image request returned none: the code (the HTTP status, 0 when no
// response or no image came) and type the exports' error details give.
type imageFailure struct {
	Code    int    `json:"code"`
	Type    string `json:"type"`
	Message string `json:"message"`
}

// warm tells a warmup request.
func (c *imageClientRecord) warm() bool { return c.Phase == phaseWarmup }

// ok tells a request that returned an image.
func (c *imageClientRecord) ok() bool { return c.Failure == nil }

// checkImageRecords checks the image layout's server records against the client's: one
// record per request; the status; the warmup flag; for every image received, the PNG's byte
// count and sha256 (the record's output and image fields both) and the controls it was asked
// with.
func checkImageRecords(client []imageClientRecord, server []serverRecord, rep *Report) {
	sv := matchRecords(requestIDs(client), server, rep)
	for i := range client {
		c := &client[i]
		s := sv[c.RequestID]
		if s == nil {
			continue
		}
		field(rep, s, c.RequestID, "route", s.Route, "/v1/images/generations")
		field(rep, s, c.RequestID, "warmup", s.Warmup, c.warm())
		if c.HTTPStatus != 0 {
			field(rep, s, c.RequestID, "status", s.Status, c.HTTPStatus)
		}
		if !c.ok() || c.PNGSHA256 == "" {
			continue
		}
		field(rep, s, c.RequestID, "output_sha256", s.OutputSHA256, c.PNGSHA256)
		field(rep, s, c.RequestID, "output_bytes", s.OutputBytes, c.PNGBytes)
		rep.Checked++
		if s.Image == nil {
			rep.add(Mismatch{Figure: fmt.Sprintf("%s %s image", serverRecordsFile, c.RequestID), Reported: "absent",
				Recomputed: "the PNG received", Records: []string{c.RequestID}})
			continue
		}
		field(rep, s, c.RequestID, "image.png_sha256", s.Image.PNGSHA256, c.PNGSHA256)
		field(rep, s, c.RequestID, "image.png_bytes", s.Image.PNGBytes, c.PNGBytes)
		field(rep, s, c.RequestID, "image.width", s.Image.Width, sizeDim(c.Size, 0))
		field(rep, s, c.RequestID, "image.height", s.Image.Height, sizeDim(c.Size, 1))
		field(rep, s, c.RequestID, "image.steps", s.Image.Steps, c.Steps)
		field(rep, s, c.RequestID, "image.guidance", s.Image.Guidance, c.Guidance)
		field(rep, s, c.RequestID, "image.seed", s.Image.Seed, c.Seed)
	}
}

// sizeDim is the width (i = 0) or height (i = 1) of a "WxH" size, or the size itself when it
// is not one (so that it shows in the mismatch).
func sizeDim(size string, i int) string {
	parts := strings.Split(size, "x")
	if len(parts) != 2 {
		return size
	}
	if _, err := strconv.Atoi(parts[i]); err != nil {
		return size
	}
	return parts[i]
}
