package server

// The informational routes: GET /health (unrecorded), /v1/models, /v1/models/{model} and
// /mq/v1/bundle.

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
)

func (s *Server) handleHealth(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	switch s.state.Load() {
	case stateLoading:
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.Write([]byte(`{"status":"loading"}`))
		return
	case stateDraining:
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.Write([]byte(`{"status":"draining"}`))
		return
	}
	if err := s.records.failure(); err != nil {
		b, _ := json.Marshal(map[string]any{"status": "records_failing", "reason": fmt.Sprintf("--records %s: %v", s.cfg.Records, err)})
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.Write(b)
		return
	}
	n := s.pool.readyWorkers()
	if n == 0 {
		reason := "every worker exited; replacements are starting"
		if err := s.pool.unavailable(); err != nil {
			reason = err.Error()
		}
		b, _ := json.Marshal(map[string]any{"status": "unavailable", "reason": reason})
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.Write(b)
		return
	}
	b, _ := json.Marshal(map[string]any{"status": "ready", "workers": n, "model": s.cfg.ModelName,
		"worker_pids": s.pool.workerPIDs(), "startup_ns": s.readyAt.Sub(s.startedAt).Nanoseconds()})
	_, _ = w.Write(b)
}

func (s *Server) modelObject() map[string]any {
	return map[string]any{"id": s.cfg.ModelName, "object": "model", "created": s.created, "owned_by": "modelqual",
		"max_model_len": s.info.MaxContext}
}

func (s *Server) handleModels(q *reqState) {
	q.writeJSON(http.StatusOK, map[string]any{"object": "list", "data": []any{s.modelObject()}})
}

func (s *Server) handleModel(q *reqState) {
	id := strings.TrimPrefix(q.r.URL.Path, "/v1/models/")
	if id != s.cfg.ModelName {
		q.fail(s.unknownModel(id))
		return
	}
	q.writeJSON(http.StatusOK, s.modelObject())
}

func (s *Server) handleBundle(q *reqState) {
	q.writeJSON(http.StatusOK, map[string]any{"header": s.header, "bundle_digest": s.fileSum, "bundle_path": s.cfg.Bundle})
}

func (s *Server) unknownModel(name string) *APIError {
	return &APIError{Status: http.StatusNotFound, Type: "not_found_error", Param: "model", Code: "model_not_found",
		Message: fmt.Sprintf("model %q does not exist; this server serves %q", name, s.cfg.ModelName)}
}
