package mitmproxy

import (
	"github.com/vibedom/vibedom/childenv"

	"context"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// ErrMitmdump marks every failure to find, start or keep mitmdump running.
var ErrMitmdump = errors.New("mitmdump")

var versionRE = regexp.MustCompile(`(?m)^Mitmproxy:\s*(\d+)\.(\d+)(\.\d+)?`)

// MitmdumpVersion runs `mitmdump --version` and checks the version is
// supported. It returns the version found; the error says what to do.
func MitmdumpVersion(ctx context.Context, program string) (string, error) {
	if program == "" {
		program = "mitmdump"
	}
	path, err := exec.LookPath(program)
	if err != nil {
		return "", fmt.Errorf("%w not found (%s): install mitmproxy %d.%d or later (`vibedom init --with-mitmproxy`, or Debian: apt-get install mitmproxy) or use --proxy-engine go",
			ErrMitmdump, program, MinMitmdumpMajor, MinMitmdumpMinor)
	}
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	vc := exec.CommandContext(ctx, path, "--version")
	vc.Env = childenv.Environ()
	out, err := vc.CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("%w at %s: `mitmdump --version` failed (%v): reinstall mitmproxy %d.%d or later or use --proxy-engine go",
			ErrMitmdump, path, err, MinMitmdumpMajor, MinMitmdumpMinor)
	}
	m := versionRE.FindSubmatch(out)
	if m == nil {
		return "", fmt.Errorf("%w at %s: `mitmdump --version` printed no version: install mitmproxy %d.%d or later or use --proxy-engine go",
			ErrMitmdump, path, MinMitmdumpMajor, MinMitmdumpMinor)
	}
	major, _ := strconv.Atoi(string(m[1]))
	minor, _ := strconv.Atoi(string(m[2]))
	v := string(m[1]) + "." + string(m[2]) + string(m[3])
	if major < MinMitmdumpMajor || (major == MinMitmdumpMajor && minor < MinMitmdumpMinor) {
		return v, fmt.Errorf("%w at %s is version %s; vibedom needs %d.%d or later: upgrade mitmproxy or use --proxy-engine go",
			ErrMitmdump, path, v, MinMitmdumpMajor, MinMitmdumpMinor)
	}
	return v, nil
}

// MitmwebProgram is the mitmweb a live view runs given Config.Mitmdump and
// .Mitmweb: mitmweb when set, else the one beside mitmdump when that is a
// path, else "mitmweb" (on PATH).
func MitmwebProgram(mitmdump, mitmweb string) string {
	switch {
	case mitmweb != "":
		return mitmweb
	case strings.ContainsRune(mitmdump, filepath.Separator):
		return filepath.Join(filepath.Dir(mitmdump), "mitmweb")
	}
	return "mitmweb"
}

// MitmwebVersion is MitmdumpVersion for mitmweb (`vibedom run --inspect`):
// a missing mitmweb is a one-line error saying what to do.
func MitmwebVersion(ctx context.Context, program string) (string, error) {
	if program == "" {
		program = "mitmweb"
	}
	if _, err := exec.LookPath(program); err != nil {
		return "", fmt.Errorf("%w: mitmweb not found (%s), which --inspect runs: install mitmproxy %d.%d or later (`vibedom init --with-mitmproxy`, or Debian: apt-get install mitmproxy) or drop --inspect",
			ErrMitmdump, program, MinMitmdumpMajor, MinMitmdumpMinor)
	}
	v, err := MitmdumpVersion(ctx, program)
	if err != nil {
		return v, fmt.Errorf("mitmweb for --inspect: %w", err)
	}
	return v, nil
}

// VersionAtLeast says whether a version MitmdumpVersion returned is at
// least major.minor.
func VersionAtLeast(v string, major, minor int) bool {
	parts := strings.SplitN(v, ".", 3)
	if len(parts) < 2 {
		return false
	}
	ma, _ := strconv.Atoi(parts[0])
	mi, _ := strconv.Atoi(parts[1])
	return ma > major || (ma == major && mi >= minor)
}
