package image

import (
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/vibedom/vibedom/vm"
)

// TestPruneKeepsTheCurrentGuestImage: with a real guest image built by
// BuildGuest, prune keeps its root image and the boot folder its recipe
// gives now, and removes an older root image and boot folder; the home
// still loads its image without building anything.
func TestPruneKeepsTheCurrentGuestImage(t *testing.T) {
	t.Parallel()
	url, key, _ := testMirror(t)
	h := seededHome(t)
	r, err := BuildGuest(t.Context(), h, GuestOptions{Arch: vm.Arch(runtime.GOARCH), Mirror: url, Keys: key.Ring})
	if err != nil {
		t.Fatal(err)
	}
	if r.Built {
		t.Errorf("the seeded home rebuilt its root image: %+v", r)
	}
	images := h.Images()
	oldRoot := RootImagePath(images, strings.Repeat("0", 64))
	if err := os.WriteFile(oldRoot, []byte("an older root image"), 0o444); err != nil {
		t.Fatal(err)
	}
	boot := filepath.Dir(r.Kernel)
	oldBoot := filepath.Join(images, (&AlpineBoot{GuestArch: vm.Arch(runtime.GOARCH)}).Name()+"-00000000deadbeef")
	if err := os.MkdirAll(oldBoot, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(oldBoot, KernelFile), []byte("an older kernel"), 0o644); err != nil {
		t.Fatal(err)
	}

	rep, err := PruneCache(t.Context(), h, PruneOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var removed []string
	for _, e := range rep.Removed {
		removed = append(removed, e.Path)
	}
	for _, p := range []string{oldRoot, oldBoot} {
		if !slices.Contains(removed, p) {
			t.Errorf("%s not removed (removed %v)", p, removed)
		}
	}
	for _, p := range []string{r.Root, r.Kernel, r.Initrd} {
		if slices.Contains(removed, p) || slices.Contains(removed, filepath.Dir(p)) {
			t.Errorf("removed the current %s", p)
		}
		if _, err := os.Stat(p); err != nil {
			t.Errorf("the current image: %v", err)
		}
	}
	gb, err := LoadGuest(t.Context(), h, vm.Arch(runtime.GOARCH), key.Ring)
	if err != nil {
		t.Fatal(err)
	}
	if gb.Image.Dir != boot || gb.RootImage != r.Root {
		t.Errorf("after prune the home boots %s and %s, want %s and %s", gb.Image.Dir, gb.RootImage, boot, r.Root)
	}
}
