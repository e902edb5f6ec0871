//go:build !linux && !darwin

package preflight

import "io/fs"

// statID is unavailable here: without a ctime and an inode the memo could
// trust a rewritten file, so every file is hashed on every scan.
func statID(fs.FileInfo) (statKey, bool) { return statKey{}, false }

func statTrusted(string) (bool, string) { return false, "unknown" }
