//go:build unix && !linux && !darwin

package overlay

import "context"

// cloneTree: no copy-on-write clone on this platform.
func cloneTree(context.Context, string, string) (int, error) { return 0, errCloneUnsupported }
