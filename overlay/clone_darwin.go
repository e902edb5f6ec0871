package overlay

import (
	"context"
	"fmt"

	"golang.org/x/sys/unix"
)

// cloneTree clones the whole workspace into dst with one clonefile(2) call
// (APFS copy-on-write; directories are cloned recursively, symlinks are not
// followed).
func cloneTree(ctx context.Context, ws, dst string) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	if err := unix.Clonefile(ws, dst, unix.CLONE_NOFOLLOW); err != nil {
		if isCloneUnsupported(err) {
			return 0, fmt.Errorf("%w: %v", errCloneUnsupported, err)
		}
		return 0, fmt.Errorf("clonefile %s: %w", ws, err)
	}
	return 0, nil
}
