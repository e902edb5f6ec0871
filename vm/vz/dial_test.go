package vz

import (
	"context"
	"errors"
	"io"
	"net"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/vibedom/vibedom/vm"
)

// echo serves one connection on l, echoing what it reads.
func echo(t *testing.T, l net.Listener) {
	t.Helper()
	go func() {
		c, err := l.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		io.Copy(c, c)
	}()
}

func TestDialRetry(t *testing.T) {
	t.Run("guest listens late", func(t *testing.T) {
		// Like a vsock port before the guest agent listens: refused until
		// the listener appears on the third attempt.
		sock := filepath.Join(t.TempDir(), "control.sock")
		var attempts atomic.Int32
		dial := func() (net.Conn, error) {
			if attempts.Add(1) == 3 {
				l, err := net.Listen("unix", sock)
				if err != nil {
					return nil, err
				}
				t.Cleanup(func() { l.Close() })
				echo(t, l)
			}
			return net.Dial("unix", sock)
		}
		conn, err := dialRetry(t.Context(), 2222, nil, dial)
		if err != nil {
			t.Fatalf("dialRetry: %v", err)
		}
		defer conn.Close()
		if got := attempts.Load(); got != 3 {
			t.Errorf("attempts: got %d, want 3", got)
		}
		if _, err := conn.Write([]byte("ping")); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 4)
		if _, err := io.ReadFull(conn, buf); err != nil || string(buf) != "ping" {
			t.Errorf("echo: got %q, %v, want \"ping\"", buf, err)
		}
	})

	t.Run("context ends", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
		defer cancel()
		reset := &net.OpError{Op: "connect", Net: "vsock", Err: syscall.ECONNRESET}
		conn, err := dialRetry(ctx, 2222, nil, func() (net.Conn, error) { return nil, reset })
		if conn != nil {
			t.Errorf("conn: got %v, want nil", conn)
		}
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("error %v: does not wrap context.DeadlineExceeded", err)
		}
		if !errors.Is(err, syscall.ECONNRESET) {
			t.Errorf("error %v: does not wrap the last attempt's error", err)
		}
		if !strings.Contains(err.Error(), "port 2222") {
			t.Errorf("error %v: does not name the port", err)
		}
	})

	t.Run("machine stops", func(t *testing.T) {
		stopped := make(chan struct{})
		var attempts atomic.Int32
		conn, err := dialRetry(t.Context(), 2222, stopped, func() (net.Conn, error) {
			if attempts.Add(1) == 2 {
				close(stopped)
			}
			return nil, syscall.ECONNRESET
		})
		if conn != nil || !errors.Is(err, vm.ErrNotRunning) {
			t.Errorf("dialRetry: got %v, %v, want nil, vm.ErrNotRunning", conn, err)
		}
	})

	t.Run("already cancelled", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		_, err := dialRetry(ctx, 2222, nil, func() (net.Conn, error) {
			return nil, syscall.ECONNRESET
		})
		if !errors.Is(err, context.Canceled) {
			t.Errorf("error %v: does not wrap context.Canceled", err)
		}
	})

	t.Run("hung attempt is abandoned and its late connection closed", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
		defer cancel()
		release := make(chan struct{})
		hostEnd, guestEnd := net.Pipe()
		defer guestEnd.Close()
		_, err := dialRetry(ctx, 2222, nil, func() (net.Conn, error) {
			<-release // a connect that never completes in time
			return hostEnd, nil
		})
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("error %v: does not wrap context.DeadlineExceeded", err)
		}
		close(release)
		// The abandoned connection must be closed, not leaked: the other end
		// sees EOF.
		guestEnd.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := guestEnd.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
			t.Errorf("read on the far end of an abandoned connection: got %v, want EOF", err)
		}
	})
}

func TestRunCtx(t *testing.T) {
	errOp := errors.New("op failed")
	t.Run("op result", func(t *testing.T) {
		if err := runCtx(t.Context(), func() error { return errOp }); !errors.Is(err, errOp) {
			t.Errorf("runCtx: got %v, want %v", err, errOp)
		}
	})
	t.Run("context first", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		block := make(chan struct{})
		defer close(block)
		cancel()
		if err := runCtx(ctx, func() error { <-block; return nil }); !errors.Is(err, context.Canceled) {
			t.Errorf("runCtx: got %v, want context.Canceled", err)
		}
	})
}
