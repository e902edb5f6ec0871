package session

import (
	"context"
	"errors"
	"fmt"

	"github.com/vibedom/vibedom/policy"
	"github.com/vibedom/vibedom/preflight"
	"github.com/vibedom/vibedom/termtext"
)

// PreflightOptions configure the secrets scan before boot.
type PreflightOptions struct {
	// Mode is prompt (the default), warn, strict or off.
	Mode preflight.Mode
}

// ErrCancelled means the user chose not to start the session.
var ErrCancelled = errors.New("cancelled")

// runPreflight scans the workspace for secrets on the host and lets the
// user decide before anything boots. It returns the report (nil when the
// scan was off).
func (s *sess) runPreflight(ctx context.Context) (*preflight.Report, error) {
	o := &s.opts
	in, out, tty := o.Stdin, o.Stderr, false
	if o.Terminal != nil {
		in, out, tty = o.Terminal.In, o.Terminal.Out, true
	}
	if o.Preflight.Mode == preflight.ModeOff {
		_, err := preflight.Review(ctx, nil, in, out, tty, preflight.ModeOff)
		return nil, err
	}
	s.progress("scanning %s for secrets (gitleaks)", termtext.Line(s.plan.workspace))
	rep, err := preflight.Scan(ctx, policy.ScanOptions(o.Home, s.plan.workspace))
	if err != nil {
		return nil, fmt.Errorf("secrets preflight: %w", err)
	}
	outcome, err := preflight.Review(ctx, rep, in, out, tty, o.Preflight.Mode)
	if err != nil {
		return rep, err
	}
	switch outcome {
	case preflight.OutcomeContinue:
		return rep, nil
	case preflight.OutcomeRefused:
		return rep, errors.New("strict preflight refused to start: approve the findings with `vibedom preflight --review PATH` or remove the secrets")
	default:
		return rep, fmt.Errorf("%w: nothing was started", ErrCancelled)
	}
}
