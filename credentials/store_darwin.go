//go:build darwin

package credentials

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/vibedom/vibedom/childenv"
)

// keychainService names vibedom's items in the login Keychain (generic
// passwords, account = the secret's name).
const keychainService = "vibedom"

// newStore is the login Keychain through the `security` tool, the 0600
// files of <home>/credentials read as a fallback (keys stored before the
// Keychain was used) and used alone when `security` is missing or
// $VIBEDOM_CREDENTIAL_STORE is "file" (tests). Items of a home other than
// ~/.vibedom ($VIBEDOM_HOME) carry the home's hash in their account, so
// two homes never share one.
func newStore(home string) secretStore {
	files := fileStore{dir: Dir(home)}
	if _, err := exec.LookPath("security"); err != nil || os.Getenv("VIBEDOM_CREDENTIAL_STORE") == "file" {
		return files
	}
	suffix := ""
	if hd, err := os.UserHomeDir(); err != nil || filepath.Clean(home) != filepath.Join(hd, ".vibedom") {
		sum := sha256.Sum256([]byte(filepath.Clean(home)))
		suffix = "@" + hex.EncodeToString(sum[:])[:8]
	}
	return keychainStore{files: files, suffix: suffix}
}

type keychainStore struct {
	files  fileStore
	suffix string // "" for ~/.vibedom, else "@" and the home's hash
}

func (s keychainStore) where(name string) string {
	return fmt.Sprintf("the login Keychain (service %q, account %q)", keychainService, name+s.suffix)
}

func (s keychainStore) get(name string) ([]byte, error) {
	b, err := findGenericPassword(keychainService, name+s.suffix)
	if errors.Is(err, fs.ErrNotExist) {
		return s.files.get(name)
	}
	return b, err
}

func (s keychainStore) put(name string, b []byte) error {
	// -i reads the command from stdin, so the secret is never in an
	// argument list (ps shows those); -X takes it hex-encoded.
	cmd := fmt.Sprintf("add-generic-password -U -s %s -a %s -X %s\n", keychainService, name+s.suffix, hex.EncodeToString(b))
	if _, err := security(strings.NewReader(cmd), "-i"); err != nil {
		return fmt.Errorf("store %s in the login Keychain: %w", name, err)
	}
	return s.files.del(name) // the Keychain holds it now
}

func (s keychainStore) del(name string) error {
	_, err := security(nil, "delete-generic-password", "-s", keychainService, "-a", name+s.suffix)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("delete %s from the login Keychain: %w", name, err)
	}
	return s.files.del(name)
}

// vendorKeychain reads a generic password another program keeps in the
// login Keychain; macOS asks the user once whether vibedom may read it.
func vendorKeychain(service, account string) ([]byte, error) {
	return findGenericPassword(service, account)
}

func findGenericPassword(service, account string) ([]byte, error) {
	out, err := security(nil, "find-generic-password", "-s", service, "-a", account, "-w")
	if err != nil {
		return nil, fmt.Errorf("the Keychain item %q (account %q): %w", service, account, err)
	}
	out = bytes.TrimRight(out, "\n")
	// A value that is not printable comes back hex-encoded.
	if h, err := hex.DecodeString(string(out)); err == nil && len(out) > 0 && !bytes.HasPrefix(out, []byte("{")) {
		return h, nil
	}
	return out, nil
}

// security runs /usr/bin/security; exit status 44 (no such item) is
// fs.ErrNotExist.
func security(stdin *strings.Reader, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute) // the user may be asked
	defer cancel()
	cmd := exec.CommandContext(ctx, "security", args...)
	cmd.Env = childenv.Environ()
	if stdin != nil {
		cmd.Stdin = stdin
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	var ee *exec.ExitError
	if errors.As(err, &ee) && ee.ExitCode() == 44 {
		return nil, fs.ErrNotExist
	}
	if err != nil {
		return nil, fmt.Errorf("security %s: %w: %s", args[0], err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}
