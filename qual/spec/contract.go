package spec

import (
	"context"
	"errors"
	"fmt"
	"strings"
)

// RefusedControl is a request field the server does not support yet and must refuse by name
// (never silently ignore): the request must get a 4xx whose error message names Field.
type RefusedControl struct {
	Field string
	Route string // "/v1/completions" or "/v1/chat/completions"
	Value any
}

// DefaultRefusedControls are the OpenAI controls qual-server refuses today.
func DefaultRefusedControls() []RefusedControl {
	return []RefusedControl{
		{Field: "best_of", Route: "/v1/completions", Value: 2},
		{Field: "echo", Route: "/v1/completions", Value: true},
		{Field: "tools", Route: "/v1/chat/completions", Value: []map[string]any{{"type": "function", "function": map[string]any{"name": "f", "parameters": map[string]any{"type": "object"}}}}},
	}
}

// ContextInput is the input of ContextContract and CheckContext.
type ContextInput struct {
	// API reaches the served model.
	API *API
	// MaxContext is the served context (prompt + max_tokens), from the manifest's
	// build.max_context.
	MaxContext int
	// Refused lists controls that must be refused by name; nil means none are checked.
	Refused []RefusedControl
	// OpenAIOnly holds the server to OpenAI's contract alone (an over-context request gets a
	// 4xx, the next valid request is served), not to qual-server's own policies (exactly 400
	// with a message; Refused controls refused by name): for a server the harness did not
	// build (the external launcher), where refusing `n` is a choice, not a contract.
	OpenAIOnly bool
}

// CheckContext is ContextContract's core, the capacity contract: a prompt that fills the
// context, and max_tokens beyond it, each get HTTP 400 naming the limit, and the next valid
// request gets 200; every refused control gets a 4xx naming the field, followed again by a 200.
func CheckContext(ctx context.Context, in ContextInput) error {
	const fn = "spec.CheckContext"
	switch {
	case in.API == nil:
		return fmt.Errorf("%s: ContextInput.API is nil", fn)
	case in.MaxContext < 2:
		return fmt.Errorf("%s: ContextInput.MaxContext %d must be at least 2; pass the manifest's build.max_context", fn, in.MaxContext)
	}
	var problems []string
	valid := func(after string) {
		ans, err := in.API.Complete(ctx, "/v1/completions", map[string]any{"prompt": []int32{1, 2, 3}, "max_tokens": 2, "temperature": 0})
		if err != nil {
			problems = append(problems, fmt.Sprintf("the valid request after %s failed: %v", after, err))
		} else if ans.Text == "" && ans.CompletionTokens == 0 {
			problems = append(problems, fmt.Sprintf("the valid request after %s returned no tokens", after))
		}
	}
	over := make([]int32, in.MaxContext)
	for i := range over {
		over[i] = int32(1 + i%100)
	}
	cases := []struct {
		what string
		body map[string]any
	}{
		{fmt.Sprintf("a %d-token prompt (the whole context) with max_tokens 1", len(over)), map[string]any{"prompt": over, "max_tokens": 1}},
		{fmt.Sprintf("max_tokens %d on a 3-token prompt", in.MaxContext), map[string]any{"prompt": []int32{1, 2, 3}, "max_tokens": in.MaxContext}},
	}
	for _, c := range cases {
		_, err := in.API.Complete(ctx, "/v1/completions", c.body)
		var ae *APIError
		switch {
		case !errors.As(err, &ae):
			problems = append(problems, fmt.Sprintf("%s beyond the served context %d was accepted (err %v); want HTTP 400", c.what, in.MaxContext, err))
		case in.OpenAIOnly && ae.Status/100 != 4:
			problems = append(problems, fmt.Sprintf("%s beyond the served context %d got HTTP %d; OpenAI's contract is a 4xx", c.what, in.MaxContext, ae.Status))
		case in.OpenAIOnly:
		case ae.Status != 400:
			problems = append(problems, fmt.Sprintf("%s beyond the served context %d got HTTP %d; want 400", c.what, in.MaxContext, ae.Status))
		case ae.Message == "":
			problems = append(problems, fmt.Sprintf("%s got 400 without an error message", c.what))
		}
		valid(c.what)
	}
	refused := in.Refused
	if in.OpenAIOnly {
		refused = nil
	}
	for _, rc := range refused {
		route, body := rc.Route, map[string]any{rc.Field: rc.Value, "max_tokens": 2}
		if route == "/v1/chat/completions" {
			body["messages"] = []map[string]any{{"role": "user", "content": "hi"}}
		} else {
			body["prompt"] = "hi"
		}
		_, err := in.API.Complete(ctx, route, body)
		var ae *APIError
		switch {
		case !errors.As(err, &ae):
			problems = append(problems, fmt.Sprintf("control %q on %s was accepted (err %v); unsupported controls must be refused by name, not ignored", rc.Field, route, err))
		case ae.Status/100 != 4:
			problems = append(problems, fmt.Sprintf("control %q on %s got HTTP %d; want a 4xx", rc.Field, route, ae.Status))
		case !strings.Contains(ae.Message, rc.Field) && ae.Param != rc.Field:
			problems = append(problems, fmt.Sprintf("control %q on %s was refused with %q, which does not name the field", rc.Field, route, ae.Message))
		}
		valid(fmt.Sprintf("control %q", rc.Field))
	}
	if len(problems) > 0 {
		return errors.New("context contract gate:\n  " + strings.Join(problems, "\n  "))
	}
	return nil
}
