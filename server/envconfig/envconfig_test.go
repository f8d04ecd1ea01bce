package envconfig

import (
	"strings"
	"testing"
)

func TestGetFallsBackToDefault(t *testing.T) {
	t.Setenv(GPUPrecision.Name, "")
	if got := GPUPrecision.Get(); got != "bf16" {
		t.Fatalf("unset %s: got %q, want its default %q", GPUPrecision.Name, got, "bf16")
	}
	t.Setenv(GPUPrecision.Name, "fp16")
	if got := GPUPrecision.Get(); got != "fp16" {
		t.Fatalf("%s=fp16: got %q", GPUPrecision.Name, got)
	}
}

func TestLookupTellsUnsetFromEmpty(t *testing.T) {
	t.Setenv(ServerAPIKey.Name, "")
	if v, ok := ServerAPIKey.Lookup(); !ok || v != "" {
		t.Fatalf("set empty: got (%q, %v), want (\"\", true)", v, ok)
	}
}

func TestBool(t *testing.T) {
	for in, want := range map[string]bool{"1": true, "TRUE": true, "on": true, "0": false, "": false, "no": false} {
		t.Setenv(NoSourceFinger.Name, in)
		if got := NoSourceFinger.Bool(); got != want {
			t.Errorf("%s=%q: Bool() = %v, want %v", NoSourceFinger.Name, in, got, want)
		}
	}
}

// TestEveryVariableIsDocumented keeps the list useful as documentation.
func TestEveryVariableIsDocumented(t *testing.T) {
	vars := All()
	if len(vars) < 20 {
		t.Fatalf("All() lists %d variables; the declarations above hold more", len(vars))
	}
	for _, v := range vars {
		if v.Name == "" || strings.TrimSpace(v.Description) == "" {
			t.Errorf("variable %q has no description", v.Name)
		}
	}
}
