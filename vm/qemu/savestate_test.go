package qemu

import (
	"errors"
	"testing"

	"github.com/vibedom/vibedom/vm"
)

// TestNoSaveState keeps QEMU machines from claiming they can save their
// state while QEMU refuses to migrate with a workspace share (machine.go).
func TestNoSaveState(t *testing.T) {
	var m vm.Machine = &machine{}
	if _, ok := m.(vm.StateSaver); ok {
		t.Fatalf("the QEMU machine implements vm.StateSaver; QEMU cannot save a machine with a 9p or virtiofs share")
	}
	if err := vm.SaveStateSupported(m); !errors.Is(err, vm.ErrSaveUnsupported) {
		t.Errorf("SaveStateSupported: got %v, want vm.ErrSaveUnsupported", err)
	}
	var d vm.Driver = &Driver{}
	if _, ok := d.(vm.Restorer); ok {
		t.Errorf("the QEMU driver implements vm.Restorer")
	}
}
