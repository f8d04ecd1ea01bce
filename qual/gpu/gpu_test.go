package gpu

import (
	"errors"
	"os"
	"testing"
	"time"
)

// On machines without an NVIDIA driver (CI), NVML must fail cleanly: telemetry unavailable
// with a reason, no panic, and an error only when GPUs were required.
func TestWithoutDriverOrWith(t *testing.T) {
	inv := Inspect()
	s, err := StartSampler(nil, 10*time.Millisecond, false)
	if err != nil {
		t.Fatalf("not required, yet: %v", err)
	}
	time.Sleep(50 * time.Millisecond) // a few samples; nothing is asserted on timing
	tel := s.Stop()
	if !inv.Available {
		if inv.Reason == "" || tel.Available || tel.Reason == "" {
			t.Fatalf("unavailable telemetry must say why: inventory %+v telemetry %+v", inv, tel)
		}
		if err := Require(inv); !errors.Is(err, ErrUnavailable) {
			t.Fatalf("Require = %v", err)
		}
		if _, err := StartSampler(nil, 0, true); !errors.Is(err, ErrUnavailable) {
			t.Fatalf("required sampler: %v", err)
		}
		t.Logf("no GPU telemetry here: %s", inv.Reason)
		return
	}
	if os.Getenv("MODELQUAL_EXPECT_NO_GPU") != "" {
		t.Fatalf("expected no GPU, found %+v", inv)
	}
	if len(inv.Devices) == 0 || inv.Devices[0].UUID == "" || inv.DriverVersion == "" || !tel.Available || len(tel.Devices) != len(inv.Devices) || tel.Devices[0].Samples < 1 {
		t.Fatalf("inventory %+v telemetry %+v", inv, tel)
	}
	tel.PerToken(100)
	t.Logf("inventory %+v", inv)
	t.Logf("telemetry %+v", tel)
}
