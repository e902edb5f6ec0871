package vz

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/vibedom/vibedom/vm"
)

// dialFunc makes one connection attempt. It may block; dialRetry abandons it
// when ctx ends.
type dialFunc func() (net.Conn, error)

// dialRetry calls dial until it succeeds, ctx ends or the machine ends
// (stopped is closed), waiting vm.Backoff between attempts. Until the guest
// agent listens, a vsock connect fails at once (ECONNRESET), so failures are
// expected and retried whatever they are. On ctx's end the error wraps
// ctx.Err() and the last attempt's error; once the machine has ended it
// wraps vm.ErrNotRunning.
func dialRetry(ctx context.Context, port uint32, stopped <-chan struct{}, dial dialFunc) (net.Conn, error) {
	var last error
	for n := 0; ; n++ {
		select {
		case <-stopped:
			return nil, fmt.Errorf("dial control port %d: %w", port, vm.ErrNotRunning)
		default:
		}
		conn, err := dialOnce(ctx, dial)
		if err == nil {
			return conn, nil
		}
		if ctx.Err() != nil {
			return nil, dialGaveUp(ctx, port, last, n)
		}
		last = err
		t := time.NewTimer(vm.Backoff(n))
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, dialGaveUp(ctx, port, last, n+1)
		case <-stopped:
			t.Stop()
			return nil, fmt.Errorf("dial control port %d: %w", port, vm.ErrNotRunning)
		case <-t.C:
		}
	}
}

func dialGaveUp(ctx context.Context, port uint32, last error, attempts int) error {
	if last == nil {
		return fmt.Errorf("dial control port %d: %w", port, ctx.Err())
	}
	return fmt.Errorf("dial control port %d: gave up after %d attempts: %w (last attempt: %w); is the guest agent running? the console log shows its boot", port, attempts, ctx.Err(), last)
}

// errAbandoned marks an attempt that was still running when ctx ended.
var errAbandoned = errors.New("connection attempt abandoned")

// dialOnce runs one attempt, returning when it finishes or ctx ends. An
// abandoned attempt that later succeeds has its connection closed.
func dialOnce(ctx context.Context, dial dialFunc) (net.Conn, error) {
	type result struct {
		conn net.Conn
		err  error
	}
	ch := make(chan result, 1)
	go func() {
		c, err := dial()
		ch <- result{c, err}
	}()
	select {
	case r := <-ch:
		return r.conn, r.err
	case <-ctx.Done():
		go func() {
			if r := <-ch; r.err == nil && r.conn != nil {
				r.conn.Close()
			}
		}()
		return nil, errAbandoned
	}
}

// runCtx runs op, a blocking hypervisor call that takes no context, and
// returns its result, or ctx's error if ctx ends first (op still completes
// in the background).
func runCtx(ctx context.Context, op func() error) error {
	ch := make(chan error, 1)
	go func() { ch <- op() }()
	select {
	case err := <-ch:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}
