//go:build !unix

package overlay

import "os"

// mostlyHoles is false where the allocated size is not known.
func mostlyHoles(os.FileInfo) bool { return false }
