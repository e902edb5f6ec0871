//go:build !linux && !darwin

package session

import "errors"

func availableMemoryMiB() (int, error) {
	return 0, errors.New("cannot read host memory on this platform")
}
