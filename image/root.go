package image

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"

	"github.com/vibedom/vibedom/atomicfile"
	"github.com/vibedom/vibedom/home"
)

// RootDir is the folder of the cache that holds root images, each named
// <sha256>.ext4 after its content: sessions share one file read-only.
const RootDir = home.RootImagesDir

// ErrRootImage means a root image is missing or does not match its name.
var ErrRootImage = errors.New("root image damaged or missing")

var hexSHA256 = regexp.MustCompile(`^[0-9a-f]{64}$`)

// RootImagePath is where the root image with content sha lives.
func RootImagePath(cacheRoot, sha string) string {
	return filepath.Join(cacheRoot, RootDir, sha+".ext4")
}

// VerifyRootImage checks that the root image at path is a regular file
// whose SHA-256 is sha. The check is cheap when the file is unchanged since
// it was last hashed (the cache memo keeps its identity: device, inode,
// size, times); a changed file, or full, hashes it whole (hundreds of MB:
// about a second). vibedom doctor asks for full.
func VerifyRootImage(cacheRoot, path, sha string, full bool) error {
	if !hexSHA256.MatchString(sha) {
		return fmt.Errorf("%w: %q is not a SHA-256", ErrRootImage, sha)
	}
	fi, err := os.Lstat(path)
	if err != nil {
		return fmt.Errorf("%w: %v: run `vibedom init`", ErrRootImage, err)
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("%w: %s is not a regular file: remove it and run `vibedom init`", ErrRootImage, path)
	}
	m := loadMemo(cacheRoot)
	defer m.save()
	var got string
	if full {
		got, _, err = hashFile(path)
		if err == nil {
			if id, ierr := statID(path); ierr == nil {
				m.remember(path, id, got)
			}
		}
	} else {
		got, err = m.fileSum(path)
	}
	if err != nil {
		return fmt.Errorf("%w: %v", ErrRootImage, err)
	}
	if got != sha {
		return fmt.Errorf("%w: %s has SHA-256 %s, not %s: remove it and run `vibedom init`", ErrRootImage, path, got, sha)
	}
	return nil
}

// InstallRootImage moves the freshly built image at built (hash sha, on the
// same file system) into the cache as RootImagePath and makes it
// read-only. When an image with that content is already there and intact,
// built is removed and the existing one kept.
func InstallRootImage(cacheRoot, built, sha string) (string, error) {
	dst := RootImagePath(cacheRoot, sha)
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return "", err
	}
	if VerifyRootImage(cacheRoot, dst, sha, false) == nil {
		return dst, os.Remove(built)
	}
	if err := os.Chmod(built, 0o444); err != nil {
		return "", err
	}
	if err := atomicfile.Move(built, dst); err != nil {
		return "", fmt.Errorf("install the root image: %w", err)
	}
	// The builder hashed what it wrote; remember it under the installed
	// file's identity so the next check is cheap.
	if id, err := statID(dst); err == nil {
		m := loadMemo(cacheRoot)
		m.remember(dst, id, sha)
		m.save()
	}
	return dst, nil
}
