package server

// The routing table: every HTTP request enters at ServeHTTP, which names its route, checks the
// method, the API key and the server's state around the record's begin and end, and hands a
// generation request to serve (server.go) with the route's own parts.

import (
	"crypto/subtle"
	"fmt"
	"net/http"
	"net/http/pprof"
	"os"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// ServeHTTP routes requests. Hand-written rather than http.ServeMux so 404 and 405 carry
// OpenAI error bodies and so the records know the route.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	path := r.URL.Path
	rc := http.NewResponseController(w)
	if s.cfg.WriteTimeout > 0 {
		_ = rc.SetWriteDeadline(time.Now().Add(s.cfg.WriteTimeout))
	}
	if s.cfg.BodyTimeout > 0 && r.Body != http.NoBody {
		// Also bounds the discard of a body the handler did not read.
		_ = rc.SetReadDeadline(time.Now().Add(s.cfg.BodyTimeout))
	}
	var route string
	var method string
	var h func(*reqState)
	switch path {
	case "/health":
		s.handleHealth(w, r)
		return
	case "/metrics":
		promhttp.HandlerFor(s.m.reg, promhttp.HandlerOpts{}).ServeHTTP(w, r)
		return
	case "/v1/models":
		route, method, h = path, http.MethodGet, s.handleModels
	case "/v1/completions":
		route, method, h = path, http.MethodPost, func(q *reqState) { s.serve(q, &textRoute{s: s}) }
	case "/v1/chat/completions":
		route, method, h = path, http.MethodPost, func(q *reqState) { s.serve(q, &textRoute{s: s, chat: true}) }
	case "/tokenize":
		route, method, h = path, http.MethodPost, s.handleTokenize
	case "/detokenize":
		route, method, h = path, http.MethodPost, s.handleDetokenize
	case "/mq/v1/logits":
		route, method, h = path, http.MethodPost, s.handleLogits
	case "/v1/images/generations":
		route, method, h = path, http.MethodPost, func(q *reqState) { s.serve(q, &imageRoute{s: s}) }
	case "/mq/v1/image_latents":
		route, method, h = path, http.MethodPost, func(q *reqState) { s.serve(q, &imageRoute{s: s, latents: true}) }
	case "/mq/v1/bundle":
		route, method, h = path, http.MethodGet, s.handleBundle
	default:
		if s.cfg.Pprof && strings.HasPrefix(path, "/debug/pprof/") {
			// Profiles, goroutine stacks and the command line are as sensitive as the API.
			if s.cfg.APIKey != "" && !s.authorized(r) {
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusUnauthorized)
				_, _ = w.Write(errUnauthorized.body())
				return
			}
			servePprof(w, r)
			return
		}
		if strings.HasPrefix(path, "/v1/models/") {
			route, method, h = "/v1/models/{model}", http.MethodGet, s.handleModel
			break
		}
		recorded := strings.HasPrefix(path, "/v1/") || strings.HasPrefix(path, "/mq/")
		q := s.begin(w, r, path, recorded)
		q.rc = rc
		q.fail(&APIError{Status: http.StatusNotFound, Type: "not_found_error", Message: fmt.Sprintf("no route %s %s; see /v1/models, /v1/completions, /v1/chat/completions", r.Method, path)})
		s.end(q)
		return
	}
	q := s.begin(w, r, route, true)
	q.rc = rc
	defer s.end(q)
	if r.Method != method {
		w.Header().Set("Allow", method)
		q.fail(&APIError{Status: http.StatusMethodNotAllowed, Type: "invalid_request_error", Message: fmt.Sprintf("%s does not accept %s; use %s", route, r.Method, method)})
		return
	}
	if s.cfg.APIKey != "" && !s.authorized(r) {
		q.fail(errUnauthorized)
		return
	}
	// Counted before the state is read, so a drain that sees none admitted has none coming.
	s.admitted.Add(1)
	defer s.admitted.Add(-1)
	switch s.state.Load() {
	case stateLoading:
		q.fail(&APIError{Status: http.StatusServiceUnavailable, Type: "server_error", Code: "loading", Message: "the model is still loading; poll /health until it answers ready"})
		return
	case stateDraining:
		q.fail(&APIError{Status: http.StatusServiceUnavailable, Type: "server_error", Code: "shutting_down", Message: "the server is shutting down"})
		return
	}
	if err := s.records.failure(); err != nil {
		q.fail(s.recordsError(err))
		return
	}
	h(q)
}

var errUnauthorized = &APIError{Status: http.StatusUnauthorized, Type: "authentication_error", Code: "invalid_api_key",
	Message: "missing or wrong API key; send Authorization: Bearer <key> with the key given to --api-key, --api-key-file or " + apiKeyEnv}

// redactedArgs is the command line with --api-key's value replaced, for /debug/pprof/cmdline.
func redactedArgs(args []string) []string {
	out := append([]string(nil), args...)
	for i := 0; i < len(out); i++ {
		a := out[i]
		for _, p := range []string{"-api-key", "--api-key"} {
			if a == p && i+1 < len(out) {
				out[i+1] = "REDACTED"
				i++
			} else if strings.HasPrefix(a, p+"=") {
				out[i] = p + "=REDACTED"
			}
		}
	}
	return out
}

func servePprof(w http.ResponseWriter, r *http.Request) {
	switch strings.TrimPrefix(r.URL.Path, "/debug/pprof/") {
	case "cmdline":
		// pprof.Cmdline would serve --api-key's value.
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte(strings.Join(redactedArgs(os.Args), "\x00")))
	case "profile":
		pprof.Profile(w, r)
	case "symbol":
		pprof.Symbol(w, r)
	case "trace":
		pprof.Trace(w, r)
	default:
		pprof.Index(w, r)
	}
}

func (s *Server) authorized(r *http.Request) bool {
	got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	return ok && subtle.ConstantTimeCompare([]byte(got), []byte(s.cfg.APIKey)) == 1
}
