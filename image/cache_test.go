package image

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vibedom/vibedom/image/initramfs"
	"github.com/vibedom/vibedom/vm"
)

// testRecipe builds an image from one input file: the kernel is the
// input's content prefixed with "kernel:", the initrd a cpio holding it.
type testRecipe struct {
	name   string
	input  string
	param  string
	builds atomic.Int32
	// during, when set, runs in the middle of each build.
	during func()
}

func (r *testRecipe) Name() string  { return r.name }
func (r *testRecipe) Arch() vm.Arch { return vm.ArchAMD64 }

func (r *testRecipe) Inputs(ctx context.Context, in *Inputs) error {
	if _, err := in.File("input", r.input); err != nil {
		return err
	}
	in.Param("param", r.param)
	return nil
}

func (r *testRecipe) Build(ctx context.Context, in *Inputs, dir string) (Outputs, error) {
	r.builds.Add(1)
	data, err := os.ReadFile(r.input)
	if err != nil {
		return Outputs{}, err
	}
	if r.during != nil {
		r.during()
	}
	if err := os.WriteFile(filepath.Join(dir, "vmlinuz"), append([]byte("kernel:"), data...), 0o644); err != nil {
		return Outputs{}, err
	}
	var ar initramfs.Archive
	ar.File("input", 0o644, data)
	ar.File("param", 0o644, []byte(r.param))
	cp, err := ar.Bytes()
	if err != nil {
		return Outputs{}, err
	}
	return Outputs{Kernel: "vmlinuz", Initrd: "initrd.cpio"}, os.WriteFile(filepath.Join(dir, "initrd.cpio"), cp, 0o644)
}

func newTestRecipe(t *testing.T, content string) *testRecipe {
	t.Helper()
	p := filepath.Join(t.TempDir(), "input")
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return &testRecipe{name: "test-image", input: p, param: "p1"}
}

// checkImage reads back the image and checks it holds content.
func checkImage(t *testing.T, img *Image, content string) {
	t.Helper()
	k, err := os.ReadFile(img.Kernel)
	if err != nil || string(k) != "kernel:"+content {
		t.Errorf("kernel: got %q (%v), want %q", k, err, "kernel:"+content)
	}
	data, err := os.ReadFile(img.Initrd)
	if err != nil {
		t.Fatalf("initrd: %v", err)
	}
	if int64(len(data)) != img.InitrdSize {
		t.Errorf("InitrdSize: got %d, file has %d", img.InitrdSize, len(data))
	}
	es, err := initramfs.ReadArchive(bytes.NewReader(data))
	if err != nil || len(es) != 2 || string(es[0].Data) != content {
		t.Errorf("initrd: got %v (%v), want input %q", es, err, content)
	}
	if err := Verify(img); err != nil {
		t.Errorf("Verify: %v", err)
	}
}

func TestEnsureCache(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	r := newTestRecipe(t, "one")
	ctx := t.Context()

	img, err := Ensure(ctx, root, r)
	if err != nil {
		t.Fatalf("Ensure (miss): %v", err)
	}
	checkImage(t, img, "one")
	if got := r.builds.Load(); got != 1 {
		t.Errorf("builds after a miss: got %d, want 1", got)
	}
	if !strings.HasPrefix(filepath.Base(img.Dir), "test-image-") || filepath.Dir(img.Dir) != root {
		t.Errorf("image dir %s is not <root>/test-image-<digest>", img.Dir)
	}
	var mf manifest
	data, _ := os.ReadFile(filepath.Join(img.Dir, "manifest.json"))
	if err := json.Unmarshal(data, &mf); err != nil {
		t.Fatalf("manifest: %v", err)
	}
	if mf.Files["initrd"].Size != img.InitrdSize || len(mf.Files["kernel"].SHA256) != 64 || mf.Digest != img.Digest {
		t.Errorf("manifest: got %+v", mf)
	}

	t.Run("hit", func(t *testing.T) {
		img2, err := Ensure(ctx, root, r)
		if err != nil {
			t.Fatalf("Ensure (hit): %v", err)
		}
		if got := r.builds.Load(); got != 1 {
			t.Errorf("builds after a hit: got %d, want 1", got)
		}
		if img2.Dir != img.Dir {
			t.Errorf("hit: dir %s, want %s", img2.Dir, img.Dir)
		}
	})
	t.Run("touched input is not rebuilt", func(t *testing.T) {
		future := time.Now().Add(time.Hour)
		os.Chtimes(r.input, future, future)
		img2, err := Ensure(ctx, root, r)
		if err != nil {
			t.Fatal(err)
		}
		if got := r.builds.Load(); got != 1 || img2.Dir != img.Dir {
			t.Errorf("same content, new mtime: builds %d, dir %s; want 1, %s", got, img2.Dir, img.Dir)
		}
	})
	t.Run("changed input is a miss", func(t *testing.T) {
		r2 := &testRecipe{name: r.name, input: filepath.Join(t.TempDir(), "input"), param: r.param}
		os.WriteFile(r2.input, []byte("two"), 0o644)
		img2, err := Ensure(ctx, root, r2)
		if err != nil {
			t.Fatal(err)
		}
		if img2.Dir == img.Dir || r2.builds.Load() != 1 {
			t.Errorf("changed input: dir %s (old %s), builds %d", img2.Dir, img.Dir, r2.builds.Load())
		}
		checkImage(t, img2, "two")
	})
	t.Run("changed param is a miss", func(t *testing.T) {
		r2 := &testRecipe{name: r.name, input: r.input, param: "p2"}
		img2, err := Ensure(ctx, root, r2)
		if err != nil {
			t.Fatal(err)
		}
		if img2.Dir == img.Dir || r2.builds.Load() != 1 {
			t.Errorf("changed param: dir %s (old %s), builds %d", img2.Dir, img.Dir, r2.builds.Load())
		}
	})
	t.Run("moved input is a hit", func(t *testing.T) {
		moved := filepath.Join(t.TempDir(), "elsewhere")
		data, _ := os.ReadFile(r.input)
		os.WriteFile(moved, data, 0o644)
		r2 := &testRecipe{name: r.name, input: moved, param: r.param}
		img2, err := Ensure(ctx, root, r2)
		if err != nil {
			t.Fatal(err)
		}
		if img2.Dir != img.Dir || r2.builds.Load() != 0 {
			t.Errorf("same content elsewhere: dir %s (want %s), builds %d", img2.Dir, img.Dir, r2.builds.Load())
		}
	})
	t.Run("bad name", func(t *testing.T) {
		r2 := &testRecipe{name: "../escape", input: r.input}
		if _, err := Ensure(ctx, root, r2); err == nil {
			t.Errorf("Ensure accepted recipe name %q", r2.name)
		}
	})
}

// TestEnsureCorruption damages a cached image in the ways a disk, a crash
// or a meddler would: every time the damage is detected and the image is
// rebuilt, never handed out.
func TestEnsureCorruption(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		damage func(t *testing.T, img *Image)
	}{
		{"truncated initrd", func(t *testing.T, img *Image) {
			os.Truncate(img.Initrd, img.InitrdSize/2)
		}},
		{"empty kernel", func(t *testing.T, img *Image) {
			os.Truncate(img.Kernel, 0)
		}},
		{"same-size rewrite with mtime restored", func(t *testing.T, img *Image) {
			fi, _ := os.Stat(img.Initrd)
			data, _ := os.ReadFile(img.Initrd)
			data[len(data)/2] ^= 0xff
			if err := os.WriteFile(img.Initrd, data, 0o644); err != nil {
				t.Fatal(err)
			}
			os.Chtimes(img.Initrd, fi.ModTime(), fi.ModTime())
		}},
		{"initrd replaced by a same-size file", func(t *testing.T, img *Image) {
			evil := filepath.Join(filepath.Dir(img.Initrd), "evil")
			os.WriteFile(evil, bytes.Repeat([]byte{'A'}, int(img.InitrdSize)), 0o644)
			os.Rename(evil, img.Initrd)
		}},
		{"initrd is a symlink elsewhere", func(t *testing.T, img *Image) {
			evil := filepath.Join(t.TempDir(), "evil")
			os.WriteFile(evil, bytes.Repeat([]byte{'A'}, int(img.InitrdSize)), 0o644)
			os.Remove(img.Initrd)
			os.Symlink(evil, img.Initrd)
		}},
		{"initrd missing", func(t *testing.T, img *Image) {
			os.Remove(img.Initrd)
		}},
		{"manifest missing", func(t *testing.T, img *Image) {
			os.Remove(filepath.Join(img.Dir, "manifest.json"))
		}},
		{"manifest garbage", func(t *testing.T, img *Image) {
			os.WriteFile(filepath.Join(img.Dir, "manifest.json"), []byte("{not json"), 0o644)
		}},
		{"manifest points outside", func(t *testing.T, img *Image) {
			p := filepath.Join(img.Dir, "manifest.json")
			data, _ := os.ReadFile(p)
			var mf manifest
			json.Unmarshal(data, &mf)
			f := mf.Files["initrd"]
			f.Path = "../../etc/passwd"
			mf.Files["initrd"] = f
			data, _ = json.Marshal(&mf)
			os.WriteFile(p, data, 0o644)
		}},
		{"memo garbage", func(t *testing.T, img *Image) {
			os.WriteFile(filepath.Join(filepath.Dir(img.Dir), memoName), []byte("\x00\x01garbage"), 0o644)
			os.Truncate(img.Initrd, 3)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := t.TempDir()
			r := newTestRecipe(t, "content "+tt.name)
			img, err := Ensure(t.Context(), root, r)
			if err != nil {
				t.Fatal(err)
			}
			// Warm the memo so the damage has to beat it.
			if _, err := Ensure(t.Context(), root, r); err != nil {
				t.Fatal(err)
			}
			tt.damage(t, img)
			img2, err := Ensure(t.Context(), root, r)
			if err != nil {
				t.Fatalf("Ensure after damage: %v", err)
			}
			if got := r.builds.Load(); got != 2 {
				t.Errorf("builds: got %d, want 2 (a rebuild)", got)
			}
			if img2.Dir != img.Dir {
				t.Errorf("rebuilt into %s, want %s", img2.Dir, img.Dir)
			}
			if fi, err := os.Lstat(img2.Initrd); err != nil || !fi.Mode().IsRegular() {
				t.Errorf("initrd after rebuild: %v, %v", fi, err)
			}
			checkImage(t, img2, "content "+tt.name)
		})
	}
	t.Run("Verify detects a changed file", func(t *testing.T) {
		root := t.TempDir()
		r := newTestRecipe(t, "bit rot")
		img, err := Ensure(t.Context(), root, r)
		if err != nil {
			t.Fatal(err)
		}
		data, _ := os.ReadFile(img.Initrd)
		data[0] ^= 1
		os.WriteFile(img.Initrd, data, 0o644)
		if err := Verify(img); !errors.Is(err, ErrCorrupt) {
			t.Errorf("Verify: got %v, want ErrCorrupt", err)
		}
	})
}

// TestEnsureConcurrent runs several builders of the same image at once:
// one builds, the others wait and use its result; nobody sees a partial
// image.
func TestEnsureConcurrent(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	r := newTestRecipe(t, "shared")
	started := make(chan struct{})
	var once sync.Once
	r.during = func() {
		once.Do(func() { close(started) })
		time.Sleep(50 * time.Millisecond) // widen the race window
	}
	const n = 6
	var wg sync.WaitGroup
	imgs := make([]*Image, n)
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			// Each builder has its own recipe value, as separate processes
			// would, but they share the counter.
			imgs[i], errs[i] = Ensure(t.Context(), root, r)
		})
	}
	wg.Wait()
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("builder %d: %v", i, errs[i])
		}
		if imgs[i].Dir != imgs[0].Dir {
			t.Errorf("builder %d got %s, builder 0 %s", i, imgs[i].Dir, imgs[0].Dir)
		}
		checkImage(t, imgs[i], "shared")
	}
	if got := r.builds.Load(); got != 1 {
		t.Errorf("builds: got %d, want 1 (the others wait on the lock)", got)
	}
	left, _ := filepath.Glob(filepath.Join(root, ".build-*"))
	if len(left) != 0 {
		t.Errorf("temporary build dirs left behind: %v", left)
	}
}

// TestEnsureRacingInstall has two builders both finish a build of the same
// image (as on a filesystem without working locks): the second rename must
// not corrupt the first one's result.
func TestEnsureRacingInstall(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	r := newTestRecipe(t, "racy")
	img, err := Ensure(t.Context(), root, r)
	if err != nil {
		t.Fatal(err)
	}
	// A second complete build arrives for the same directory.
	tmp, err := os.MkdirTemp(root, ".build-test-image.")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"vmlinuz", "initrd.cpio", "manifest.json"} {
		data, _ := os.ReadFile(filepath.Join(img.Dir, f))
		os.WriteFile(filepath.Join(tmp, f), data, 0o644)
	}
	if err := install(tmp, img.Dir); err != nil {
		t.Fatalf("install over an existing image: %v", err)
	}
	img2, err := Ensure(t.Context(), root, r)
	if err != nil {
		t.Fatal(err)
	}
	checkImage(t, img2, "racy")
	if got := r.builds.Load(); got != 1 {
		t.Errorf("builds: got %d, want 1", got)
	}
}

// TestEnsureInputsChangeDuringBuild changes the input while it is built:
// the result must not be cached under the old digest.
func TestEnsureInputsChangeDuringBuild(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		changes   int // how many builds change the input
		wantErr   error
		wantBuild int32
	}{
		{"once, then settled", 1, nil, 2},
		{"every time", 100, ErrInputsChanged, maxBuildAttempts},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := t.TempDir()
			r := newTestRecipe(t, "v0")
			n := 0
			r.during = func() {
				if n < tt.changes {
					n++
					os.WriteFile(r.input, []byte("v"+string(rune('0'+n%10))+strings.Repeat("x", n)), 0o644)
				}
			}
			img, err := Ensure(t.Context(), root, r)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("Ensure: got %v, want %v", err, tt.wantErr)
			}
			if got := r.builds.Load(); got != tt.wantBuild {
				t.Errorf("builds: got %d, want %d", got, tt.wantBuild)
			}
			if err == nil {
				data, _ := os.ReadFile(r.input)
				checkImage(t, img, string(data))
			}
		})
	}
}

func TestEnsureCancelled(t *testing.T) {
	t.Parallel()
	r := newTestRecipe(t, "x")
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := Ensure(ctx, t.TempDir(), r); !errors.Is(err, context.Canceled) {
		t.Errorf("Ensure with a cancelled context: got %v, want context.Canceled", err)
	}
}

func TestMemoRehashesChangedFiles(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	p := filepath.Join(t.TempDir(), "f")
	os.WriteFile(p, []byte("aaaa"), 0o644)
	m := loadMemo(root)
	s1, err := m.fileSum(p)
	if err != nil {
		t.Fatal(err)
	}
	m.save()
	m = loadMemo(root)
	fi, _ := os.Stat(p)
	os.WriteFile(p, []byte("bbbb"), 0o644)
	os.Chtimes(p, fi.ModTime(), fi.ModTime())
	s2, err := m.fileSum(p)
	if err != nil {
		t.Fatal(err)
	}
	if s1 == s2 {
		t.Errorf("same-size rewrite with the old mtime: memo returned the old hash")
	}
	if want := hexSum("bbbb"); s2 != want {
		t.Errorf("hash: got %s, want %s", s2, want)
	}
}

// TestEnsureRemovesStaleBuilds leaves build directories behind as a
// crashed builder would: the next build removes them.
func TestEnsureRemovesStaleBuilds(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	r := newTestRecipe(t, "x")
	stale := filepath.Join(root, ".build-test-image.123")
	os.MkdirAll(filepath.Join(stale, "sub"), 0o755)
	// A recipe whose name extends this one's holds another lock.
	other := filepath.Join(root, ".build-test-image-two.123")
	os.MkdirAll(other, 0o755)
	if _, err := Ensure(t.Context(), root, r); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(stale); err == nil {
		t.Errorf("stale build dir of this recipe left behind")
	}
	if _, err := os.Stat(other); err != nil {
		t.Errorf("another recipe's build dir was removed: %v", err)
	}
}
