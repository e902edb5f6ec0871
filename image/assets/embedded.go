package assets

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/vibedom/vibedom/atomicfile"
	"github.com/vibedom/vibedom/vm"
)

// embeddedGuests holds the guest agents built into this binary, one
// vibedom-guest-linux-<arch> per guest arch and a SHA256SUMS naming their
// hashes; nil in a build without them (see embed_guest.go and the
// Makefile's embed-guest target). A release build sets it.
var embeddedGuests fs.FS

// EmbeddedSumsFile is the checksum list beside the embedded guest agents,
// in sha256sum's format ("<hex>  <name>").
const EmbeddedSumsFile = "SHA256SUMS"

// ErrEmbeddedGuest means the guest agent built into this binary could not
// be put on disk: it is missing for the arch, does not match its recorded
// hash, or the cache folder is not private.
var ErrEmbeddedGuest = errors.New("embedded guest agent")

// GuestEmbedded reports whether this binary carries the guest agents.
func GuestEmbedded() bool { return embeddedGuests != nil }

// guestName is the guest agent's file name for arch.
func guestName(arch vm.Arch) string { return "vibedom-guest-linux-" + string(arch) }

// extractGuest writes the guest agent for arch from fsys into dir, unless
// an intact copy is already there, and returns its path. The file is named
// by its hash (vibedom-guest-linux-<arch>-<sha256>), written atomically
// (temporary file, rename), mode 0700, in a folder of mode 0700 that must
// be this user's and not a symlink. The embedded bytes are checked against
// fsys's SHA256SUMS before anything is written, and an existing copy is
// re-hashed before it is used: a copy that differs is replaced.
func extractGuest(fsys fs.FS, dir string, arch vm.Arch) (string, error) {
	name := guestName(arch)
	want, err := embeddedSum(fsys, name)
	if err != nil {
		return "", err
	}
	data, err := fs.ReadFile(fsys, name)
	if err != nil {
		return "", fmt.Errorf("%w: %s is not in this binary (%v): reinstall vibedom", ErrEmbeddedGuest, name, err)
	}
	if got := sha256.Sum256(data); hex.EncodeToString(got[:]) != want {
		return "", fmt.Errorf("%w: %s in this binary does not match its recorded hash: the vibedom binary is damaged, reinstall it", ErrEmbeddedGuest, name)
	}
	if err := privateDir(dir); err != nil {
		return "", err
	}
	dest := filepath.Join(dir, name+"-"+want)
	if fileSHA256(dest) == want {
		return dest, nil
	}
	if err := atomicfile.WriteFile(dest, data, 0o700); err != nil {
		return "", fmt.Errorf("%w: extract %s: %v", ErrEmbeddedGuest, name, err)
	}
	if fileSHA256(dest) != want {
		return "", fmt.Errorf("%w: %s changed while it was written: check %s", ErrEmbeddedGuest, dest, dir)
	}
	return dest, nil
}

// embeddedSum is name's hash in fsys's SHA256SUMS.
func embeddedSum(fsys fs.FS, name string) (string, error) {
	sums, err := fs.ReadFile(fsys, EmbeddedSumsFile)
	if err != nil {
		return "", fmt.Errorf("%w: no %s in this binary: reinstall vibedom", ErrEmbeddedGuest, EmbeddedSumsFile)
	}
	sc := bufio.NewScanner(bytes.NewReader(sums))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 2 && strings.TrimPrefix(f[1], "*") == name {
			if b, err := hex.DecodeString(f[0]); err != nil || len(b) != sha256.Size {
				break
			}
			return strings.ToLower(f[0]), nil
		}
	}
	return "", fmt.Errorf("%w: this binary carries no guest agent for %s (no valid line for %s in its %s)",
		ErrEmbeddedGuest, strings.TrimPrefix(name, "vibedom-guest-linux-"), name, EmbeddedSumsFile)
}

// privateDir makes dir (and missing parents, mode 0700) and checks it is
// a folder of this user's, not a symlink, and mode 0700.
func privateDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("%w: make %s: %v", ErrEmbeddedGuest, dir, err)
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrEmbeddedGuest, err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("%w: %s is not a folder (a symlink?): remove it and run vibedom again", ErrEmbeddedGuest, dir)
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && int(st.Uid) != os.Getuid() {
		return fmt.Errorf("%w: %s belongs to uid %d, not you: remove it and run vibedom again", ErrEmbeddedGuest, dir, st.Uid)
	}
	if fi.Mode().Perm() != 0o700 {
		if err := os.Chmod(dir, 0o700); err != nil {
			return fmt.Errorf("%w: make %s private: %v", ErrEmbeddedGuest, dir, err)
		}
	}
	return safeParents(dir)
}

// safeParents checks that no one but this user and root can rename the
// folders above dir (as resolved): each is this user's or root's, and not
// group- or world-writable unless sticky (/tmp). Otherwise whoever can
// write to one could swap the checked folder for their own before use.
func safeParents(dir string) error {
	real, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrEmbeddedGuest, err)
	}
	for d := filepath.Dir(real); ; d = filepath.Dir(d) {
		fi, err := os.Lstat(d)
		if err != nil {
			return fmt.Errorf("%w: %v", ErrEmbeddedGuest, err)
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if ok && int(st.Uid) != os.Getuid() && st.Uid != 0 {
			return fmt.Errorf("%w: %s, above %s, belongs to uid %d: set VIBEDOM_HOME to a folder of yours", ErrEmbeddedGuest, d, dir, st.Uid)
		}
		if fi.Mode().Perm()&0o022 != 0 && fi.Mode()&fs.ModeSticky == 0 {
			return fmt.Errorf("%w: %s, above %s, can be changed by other users (mode %v): run chmod go-w %s", ErrEmbeddedGuest, d, dir, fi.Mode().Perm(), d)
		}
		if d == filepath.Dir(d) {
			return nil
		}
	}
}

// fileSHA256 is the hex sha256 of the file at p, or "" when it cannot be
// read or is not a regular file that only this user can change: not a
// symlink, not group- or world-writable, this user's, with no other hard
// link (a link to a file elsewhere stays writable by whoever owns that
// name). The checks and the hash are of one open descriptor.
func fileSHA256(p string) string {
	f, err := os.OpenFile(p, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return ""
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm()&0o022 != 0 {
		return ""
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && (int(st.Uid) != os.Getuid() || st.Nlink != 1) {
		return ""
	}
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return ""
	}
	return hex.EncodeToString(h.Sum(nil))
}

// EmbeddedGuestSums returns the recorded sha256 (hex) of each guest agent
// built into this binary, by arch; nil in a build without them.
func EmbeddedGuestSums() map[vm.Arch]string {
	if embeddedGuests == nil {
		return nil
	}
	out := map[vm.Arch]string{}
	for _, a := range []vm.Arch{vm.ArchAMD64, vm.ArchARM64} {
		if s, err := embeddedSum(embeddedGuests, guestName(a)); err == nil {
			out[a] = s
		}
	}
	return out
}
