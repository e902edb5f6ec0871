//go:build darwin && arm64

package badvz

import (
	"testing"

	vz "github.com/Code-Hex/vz/v3"
)

func TestBoot(t *testing.T) {
	// Too many arguments: the constructor takes none.
	if _, err := vz.NewVirtioSocketDeviceConfiguration(2222); err != nil {
		t.Fatal(err)
	}
}
