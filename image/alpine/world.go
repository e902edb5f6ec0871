package alpine

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"sort"
	"strings"
)

// DefaultWorld is the package list of the guest's root image: a userland
// fit for coding agents. `~/.vibedom/packages.txt` adds to it.
var DefaultWorld = []string{
	"alpine-baselayout", "alpine-release", "busybox", "musl", "ca-certificates-bundle", "doas",
	"bash", "git", "openssh-client", "curl", "nodejs", "npm", "python3", "py3-pip",
	"ripgrep", "make", "less", "tzdata", "libstdc++", "libgcc",
}

// BootWorld are the packages the kernel and initramfs are made from. They
// are resolved and locked with the rest but left out of the root image.
var BootWorld = []string{"linux-virt", "busybox-static"}

// maxPackagesFile bounds ~/.vibedom/packages.txt.
const maxPackagesFile = 64 << 10

// ReadPackagesFile reads a package list: one name a line (optionally with a
// constraint, "git>=2.45"), blank lines and lines starting with '#'
// ignored. A missing file is an empty list. A line that is not a package
// name is an error naming the file and line.
func ReadPackagesFile(path string) ([]string, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read the package list: %w", err)
	}
	if len(b) > maxPackagesFile {
		return nil, fmt.Errorf("%s: larger than %d KiB; it lists package names, one a line", path, maxPackagesFile>>10)
	}
	var out []string
	sc := bufio.NewScanner(bytes.NewReader(b))
	for n := 1; sc.Scan(); n++ {
		l := strings.TrimSpace(sc.Text())
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		c := parseConstraint(l)
		if c.conflict || !validName(c.name) || (c.op != "" && !validVersion(c.version)) {
			return nil, fmt.Errorf("%s:%d: %q is not an Alpine package name (one name a line, optionally with a version such as git>=2.45)", path, n, l)
		}
		out = append(out, l)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return out, nil
}

func validVersion(v string) bool {
	_, err := parseVersion(v)
	return err == nil
}

// World is the whole list an image is resolved from: DefaultWorld,
// BootWorld and extra, sorted, without duplicates.
func World(extra []string) []string {
	w := append(append(slices.Clone(DefaultWorld), BootWorld...), extra...)
	sort.Strings(w)
	return slices.Compact(w)
}
