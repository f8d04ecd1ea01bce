package launch

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
)

// ExternalLauncher reaches a server started elsewhere (vLLM, llama.cpp's llama-server, a
// remote qual-server). It starts nothing and stops nothing.
type ExternalLauncher struct{ opts []Option }

// External returns a launcher for the server at WithURL.
func External(opts ...Option) *ExternalLauncher { return &ExternalLauncher{opts: opts} }

// Start waits until the server answers /health (or /v1/models where /health is absent).
func (x *ExternalLauncher) Start(ctx context.Context) (*Endpoint, error) {
	o, err := buildOptions(x.opts)
	if err != nil {
		return nil, err
	}
	if o.URL == "" {
		return nil, errors.New("launch external: no URL; pass WithURL (qual profile --url http://host:port)")
	}
	u, err := url.Parse(o.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("launch external: URL %q is not an http(s) URL such as http://127.0.0.1:8000", o.URL)
	}
	base := strings.TrimRight(o.URL, "/")
	base = strings.TrimSuffix(base, "/v1")
	ep := &Endpoint{BaseURL: base, Model: o.Model, Kind: "external"}
	if err := waitReady(ctx, base, o.StartupTimeout, nil, o.APIKey, true); err != nil {
		return ep, fmt.Errorf("launch external: %w", err)
	}
	return ep, nil
}
