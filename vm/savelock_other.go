//go:build !linux && !darwin

package vm

import (
	"fmt"
	"os"
)

func openLockFile(path string) (*os.File, error) {
	return nil, fmt.Errorf("%w: no advisory file locks on this platform", ErrNotSupported)
}

func tryFlock(*os.File) (bool, error) { return false, ErrNotSupported }

func unFlock(*os.File) {}
