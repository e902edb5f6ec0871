//go:build darwin && arm64

// Package badvz calls vz wrongly on purpose: check-darwin's test expects both
// mistakes below to be reported. testdata is outside ./..., so this package
// never breaks a build.
package badvz

import vz "github.com/Code-Hex/vz/v3"

// Boot makes two mistakes a Linux build would never see.
func Boot(m *vz.VirtualMachine) error {
	// Wrong argument type: the path is a string, not an int.
	if _, err := vz.NewSharedDirectory(42, true); err != nil {
		return err
	}
	// Wrong method name: the method is Start.
	return m.StartMachine()
}
