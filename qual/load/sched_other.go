//go:build !linux

package load

import (
	"context"
	"time"
)

// pacer falls back to Go timers (sleepUntil's short spin) where clock_nanosleep is not used.
type pacer struct{ epoch time.Time }

func newPacer(epoch time.Time, _ time.Duration) *pacer { return &pacer{epoch: epoch} }

func (p *pacer) describe() string { return "Go timers with a spin (no clock_nanosleep here)" }

func (p *pacer) wait(ctx context.Context, at time.Duration) bool { return sleepUntil(ctx, p.epoch, at) }
