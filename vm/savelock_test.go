//go:build linux || darwin

package vm

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// holdLockEnv makes the test binary a helper that holds the lock named by
// its value until its stdin closes.
const holdLockEnv = "VIBEDOM_TEST_HOLD_SAVE_LOCK"

func TestMain(m *testing.M) {
	if path := os.Getenv(holdLockEnv); path != "" {
		release, err := AcquireSaveLock(context.Background(), path, 10*time.Second)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		fmt.Println("locked")
		bufio.NewReader(os.Stdin).ReadString('\n')
		release()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func TestSaveLockGoroutines(t *testing.T) {
	path := filepath.Join(t.TempDir(), "save.lock")
	var holders, most atomic.Int32
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 5 {
				release, err := AcquireSaveLock(t.Context(), path, 10*time.Second)
				if err != nil {
					t.Error(err)
					return
				}
				n := holders.Add(1)
				for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
				}
				time.Sleep(2 * time.Millisecond)
				holders.Add(-1)
				release()
			}
		})
	}
	wg.Wait()
	if most.Load() != 1 {
		t.Errorf("at most %d goroutines held the lock at once, want 1", most.Load())
	}
}

func TestSaveLockBusy(t *testing.T) {
	path := filepath.Join(t.TempDir(), "save.lock")
	release, err := AcquireSaveLock(t.Context(), path, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	_, err = AcquireSaveLock(t.Context(), path, 100*time.Millisecond)
	if !errors.Is(err, ErrSaveLockBusy) || !strings.Contains(err.Error(), path) {
		t.Errorf("second AcquireSaveLock: got %v, want ErrSaveLockBusy naming %s", err, path)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := AcquireSaveLock(ctx, path, time.Minute); !errors.Is(err, context.Canceled) {
		t.Errorf("AcquireSaveLock with a cancelled context: got %v, want context.Canceled", err)
	}
	release()
	release2, err := AcquireSaveLock(t.Context(), path, 100*time.Millisecond)
	if err != nil {
		t.Fatalf("AcquireSaveLock after release: %v", err)
	}
	release2()
}

func TestSaveLockProcesses(t *testing.T) {
	path := filepath.Join(t.TempDir(), "save.lock")
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), holdLockEnv+"="+path)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	if line, err := bufio.NewReader(stdout).ReadString('\n'); err != nil || line != "locked\n" {
		t.Fatalf("helper: %q, %v", line, err)
	}

	_, err = AcquireSaveLock(t.Context(), path, 100*time.Millisecond)
	if !errors.Is(err, ErrSaveLockBusy) {
		t.Fatalf("AcquireSaveLock while another process holds it: got %v, want ErrSaveLockBusy", err)
	}
	if want := fmt.Sprintf("process %d", cmd.Process.Pid); !strings.Contains(err.Error(), want) {
		t.Errorf("busy error %q does not name the holder (%s)", err, want)
	}

	// The helper lets go when its stdin closes; a waiter then gets the lock.
	got := make(chan error, 1)
	go func() {
		release, err := AcquireSaveLock(t.Context(), path, 10*time.Second)
		if err == nil {
			release()
		}
		got <- err
	}()
	stdin.Close()
	if err := <-got; err != nil {
		t.Errorf("AcquireSaveLock after the other process let go: %v", err)
	}
	if err := cmd.Wait(); err != nil {
		t.Errorf("helper: %v", err)
	}
}

func TestSaveLockRefusesSymlink(t *testing.T) {
	dir := t.TempDir()
	target := filepath.Join(dir, "precious")
	if err := os.WriteFile(target, []byte("keep me"), 0o600); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "save.lock")
	if err := os.Symlink(target, path); err != nil {
		t.Fatal(err)
	}
	if release, err := AcquireSaveLock(t.Context(), path, 100*time.Millisecond); err == nil {
		release()
		t.Errorf("AcquireSaveLock through a symbolic link: got the lock, want an error")
	}
	if b, _ := os.ReadFile(target); string(b) != "keep me" {
		t.Errorf("the link's target was changed to %q", b)
	}
}

func TestDefaultSaveLockPath(t *testing.T) {
	p := DefaultSaveLockPath()
	if filepath.Dir(p) != filepath.Clean(os.TempDir()) || !strings.Contains(filepath.Base(p), fmt.Sprint(os.Getuid())) {
		t.Errorf("DefaultSaveLockPath: %s, want a per-user file in %s", p, os.TempDir())
	}
}
