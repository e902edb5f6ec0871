package alpine

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestResolveRealIndex resolves a coding-agent package set against the
// real v3.17 aarch64 main index: Alpine's own so:, cmd:, pc: and path
// provides must all be met, deterministically.
func TestResolveRealIndex(t *testing.T) {
	t.Parallel()
	path := filepath.Join("testdata", "alpine-317-aarch64", IndexFile)
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	idx, err := ReadIndex(path, "main", "aarch64", f, ReleaseKeys())
	if err != nil {
		t.Fatal(err)
	}
	world := []string{"bash", "git", "curl", "openssh-client", "python3", "ca-certificates", "make", "less", "tzdata", "nodejs", "busybox"} // npm is in community
	l, err := Resolve([]*Index{idx}, world, nil, false)
	if err != nil {
		t.Fatal(err)
	}
	again, err := Resolve([]*Index{idx}, world, nil, false)
	if err != nil || string(again.Marshal()) != string(l.Marshal()) {
		t.Fatal("two resolutions differ")
	}
	got := map[string]string{}
	for _, p := range l.Packages {
		got[p.Name] = p.Version
	}
	for _, want := range []string{"musl", "git", "libcurl", "python3", "nodejs", "busybox-binsh", "openssh-client-default", "libstdc++"} {
		if got[want] == "" {
			t.Errorf("%s not selected", want)
		}
	}
	t.Logf("%d packages: %s", len(l.Packages), strings.Join(func() []string {
		var s []string
		for _, p := range l.Packages {
			s = append(s, p.String())
		}
		return s
	}(), " "))
}
