package alpine

import (
	"strings"
	"testing"
)

func TestOptions(t *testing.T) {
	for _, c := range []struct {
		o  Options
		ok bool
	}{
		{Options{Arch: "aarch64"}, true},
		{Options{Arch: "x86_64", Mirror: "http://mirror.example/alpine/"}, true},
		{Options{Arch: "armv7"}, false},
		{Options{Arch: "x86_64", Mirror: "file:///etc"}, false},
		{Options{Arch: "x86_64", Mirror: "mirror.example"}, false},
	} {
		n, err := c.o.normalized()
		if (err == nil) != c.ok {
			t.Errorf("%+v: %v", c.o, err)
			continue
		}
		if c.ok && (n.Branch != Branch || n.Keys == nil || strings.HasSuffix(n.Mirror, "/")) {
			t.Errorf("%+v normalized to %+v", c.o, n)
		}
	}
	t.Setenv(MirrorEnv, " https://m.example/alpine ")
	if MirrorFromEnv() != "https://m.example/alpine" {
		t.Errorf("MirrorFromEnv %q", MirrorFromEnv())
	}
	if a, err := GuestArch("arm64"); a != "aarch64" || err != nil {
		t.Errorf("GuestArch(arm64) = %q, %v", a, err)
	}
}
