//go:build !(darwin && arm64)

package vz

import (
	"errors"
	"testing"

	"github.com/vibedom/vibedom/vm"
)

func TestUnavailable(t *testing.T) {
	d, err := New(nil)
	if d != nil || !errors.Is(err, vm.ErrUnavailable) {
		t.Errorf("New: got %v, %v, want nil, an error wrapping vm.ErrUnavailable", d, err)
	}
	var zero Driver
	if got := zero.Name(); got != "vz" {
		t.Errorf("Name: got %q, want %q", got, "vz")
	}
	if err := zero.Available(t.Context(), vm.ArchARM64); !errors.Is(err, vm.ErrUnavailable) {
		t.Errorf("Available: got %v, want an error wrapping vm.ErrUnavailable", err)
	}
	m, err := zero.Start(t.Context(), vm.Config{})
	if m != nil || !errors.Is(err, vm.ErrUnavailable) {
		t.Errorf("Start: got %v, %v, want nil, an error wrapping vm.ErrUnavailable", m, err)
	}
}
