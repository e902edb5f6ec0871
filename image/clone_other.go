//go:build !linux && !darwin

package image

import (
	"errors"
	"io/fs"
	"os"
)

func cloneFile(dstPath, srcPath string, perm fs.FileMode) (*os.File, error) {
	return nil, errors.ErrUnsupported
}
