//go:build darwin && arm64

package vz

import (
	"errors"
	"os"
	"syscall"
	"testing"

	"github.com/vibedom/vibedom/vm"
)

// These tests need a Mac but no kernel: they stop before anything boots.

func TestDarwinAvailable(t *testing.T) {
	d, err := New(nil)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	if err := d.Available(t.Context(), vm.ArchAMD64); !errors.Is(err, vm.ErrUnavailable) {
		t.Errorf("Available(amd64): got %v, want an error wrapping vm.ErrUnavailable", err)
	}
	if err := d.Available(t.Context(), vm.ArchARM64); err != nil {
		t.Logf("Available(arm64): %v (an old macOS?)", err)
	}
	lim := hostLimits()
	if lim.minCPUs < 1 || lim.maxCPUs < lim.minCPUs || lim.minMem == 0 || lim.maxMem < lim.minMem {
		t.Errorf("hostLimits: implausible %+v", lim)
	}
}

func TestDarwinStartRefusesBadConfig(t *testing.T) {
	d, err := New(nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Available(t.Context(), vm.ArchARM64); err != nil {
		t.Skipf("vz unavailable: %v", err)
	}
	tests := []struct {
		name   string
		modify func(t *testing.T, c *vm.Config)
		want   error
	}{
		{"compressed kernel", func(t *testing.T, c *vm.Config) {
			if err := os.WriteFile(c.Kernel, []byte{0x1f, 0x8b, 8, 0}, 0o600); err != nil {
				t.Fatal(err)
			}
		}, ErrKernelFormat},
		{"too many cpus", func(_ *testing.T, c *vm.Config) { c.CPUs = int(hostLimits().maxCPUs) + 1 }, vm.ErrInvalidConfig},
		{"amd64 guest", func(_ *testing.T, c *vm.Config) { c.Arch = vm.ArchAMD64 }, vm.ErrUnavailable},
		{"stream socket as network", func(t *testing.T, c *vm.Config) {
			a, _ := socketPair(t, syscall.SOCK_STREAM)
			c.Network = &vm.Network{Conn: a}
		}, vm.ErrInvalidConfig},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := fixture(t)
			tt.modify(t, &cfg)
			m, err := d.Start(t.Context(), cfg)
			if m != nil {
				m.Kill()
				t.Fatalf("Start: got a machine, want an error")
			}
			if !errors.Is(err, tt.want) {
				t.Errorf("Start: got %v, want an error wrapping %v", err, tt.want)
			}
		})
	}
}
