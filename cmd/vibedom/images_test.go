package main

import (
	"bufio"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vibedom/vibedom/e2e/clitest"
	"github.com/vibedom/vibedom/image"
	"github.com/vibedom/vibedom/image/assets"
	"github.com/vibedom/vibedom/session"
	"github.com/vibedom/vibedom/vm"
)

// imagesCLI is a CLI whose home has its own image cache (not the shared
// one clitest links), so a prune touches nothing of other tests.
func imagesCLI(t *testing.T) (*clitest.CLI, string) {
	t.Helper()
	c := clitest.New(t)
	p := filepath.Join(c.Home, "images")
	if fi, err := os.Lstat(p); err == nil && fi.Mode()&os.ModeSymlink != 0 {
		if err := os.Remove(p); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.MkdirAll(filepath.Join(p, image.RootDir), 0o755); err != nil {
		t.Fatal(err)
	}
	return c, p
}

func sha(c byte) string { return strings.Repeat(string(c), 64) }

func writeFile(t *testing.T, p string, data string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

// fakeBoot writes a boot image folder the way Ensure lays it out.
func fakeBoot(t *testing.T, images, name string, arch vm.Arch) string {
	t.Helper()
	dir := filepath.Join(images, name)
	writeFile(t, filepath.Join(dir, "kernel"), "kernel")
	writeFile(t, filepath.Join(dir, "initramfs.cpio"), "initrd")
	writeFile(t, filepath.Join(dir, "manifest.json"), `{"name":"`+name[:len(name)-17]+`","arch":"`+string(arch)+`","digest":"`+name[len(name)-16:]+`","created":"2026-01-02T03:04:05Z","files":{}}`)
	return dir
}

// fakeSession writes a session's state.json the way the session host
// does, with the files that make it recoverable or waiting for review.
func fakeSession(t *testing.T, home, name string, st session.State, files ...string) {
	t.Helper()
	dir := filepath.Join(home, "sessions", name)
	st.Name, st.Workspace, st.Created, st.LogDir = name, t.TempDir(), time.Now().UTC(), filepath.Join(home, "logs", name)
	b, err := json.MarshalIndent(&st, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(dir, "state.json"), string(b))
	for _, f := range files {
		writeFile(t, filepath.Join(dir, f), "x\n")
	}
}

type imagesReport struct {
	Entries []struct {
		Name string   `json:"name"`
		Kind string   `json:"kind"`
		Keep bool     `json:"keep"`
		Why  []string `json:"why"`
		Size int64    `json:"size"`
	} `json:"entries"`
	Unneeded int64 `json:"unneeded_bytes"`
	Removed  []struct {
		Name string `json:"name"`
	} `json:"removed"`
	Freed  int64 `json:"freed_bytes"`
	DryRun bool  `json:"dry_run"`
}

func runImages(t *testing.T, c *clitest.CLI, args ...string) imagesReport {
	t.Helper()
	stdout, stderr, code := c.Run(t, "", append([]string{"images"}, append(args, "--json")...)...)
	if code != 0 {
		t.Fatalf("images %v: exit %d\n%s", args, code, stderr)
	}
	var r imagesReport
	if err := json.Unmarshal([]byte(stdout), &r); err != nil {
		t.Fatalf("images %v --json: %v\n%s", args, err, stdout)
	}
	return r
}

func (r imagesReport) removed() []string {
	var out []string
	for _, e := range r.Removed {
		out = append(out, e.Name)
	}
	slices.Sort(out)
	return out
}

// tree lists every path under dir (not following symlinks) with its size.
func tree(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err == nil && !strings.HasSuffix(p, ".lock") && filepath.Base(p) != "memo.json" {
			out = append(out, p+" "+fi.Mode().String())
		}
		return nil
	})
	return out
}

func TestImagesPrune(t *testing.T) {
	c, images := imagesCLI(t)
	// The test process locates the assets as the CLI does: in its home,
	// then .cache/assets above the working folder.
	t.Setenv("VIBEDOM_HOME", c.Home)
	host := session.HostArch()
	other := vm.ArchARM64
	if host == vm.ArchARM64 {
		other = vm.ArchAMD64
	}
	a, err := assets.Locate(host)
	if err != nil {
		t.Skipf("no Linux test assets (make assets): %v", err)
	}
	// A real cache entry, built by the code: the current test image.
	cur, err := image.Ensure(t.Context(), images, image.NewDebianTest(a, nil))
	if err != nil {
		t.Fatal(err)
	}
	current := filepath.Base(cur.Dir)

	outside := t.TempDir()
	secret := filepath.Join(outside, "secret")
	writeFile(t, secret, "not the cache's")

	stale := "debian-test-" + string(host) + "-00000000deadbeef"
	fakeBoot(t, images, stale, host)
	// A symlink inside a stale folder: removing the folder removes the link only.
	if err := os.Symlink(secret, filepath.Join(images, stale, "link")); err != nil {
		t.Fatal(err)
	}
	otherBoot := "alpine-boot-" + string(other) + "-0123456789abcdef"
	fakeBoot(t, images, otherBoot, other)
	root := func(c byte) string { return filepath.Join(images, image.RootDir, sha(c)+".ext4") }
	for _, r := range []byte("abcde") {
		writeFile(t, root(r), strings.Repeat("r", 4096))
	}
	// The index of the lock that built root a goes with it.
	index := filepath.Join(images, image.RootDir, "lock-"+sha('9')+".json")
	writeFile(t, index, `{"root":{"path":"x","sha256":"`+sha('a')+`","size":4096}}`)
	// Planted: names the cache writes, but symlinks out of it.
	planted := filepath.Join(images, "debian-test-"+string(host)+"-1111111111111111")
	if err := os.Symlink(outside, planted); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(secret, root('f')); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(images, "notes.txt"), "a name the cache does not write")
	// Root image builds: one whose process is gone, one in a live process.
	deadBuild := image.RootDir + "/.build-999999999-0123456789ab.ext4"
	liveBuild := image.RootDir + "/.build-" + strconv.Itoa(os.Getpid()) + "-0123456789ab.ext4"
	writeFile(t, filepath.Join(images, deadBuild), "half a root image")
	writeFile(t, filepath.Join(images, liveBuild), "half a root image")

	fakeSession(t, c.Home, "review-1", session.State{Status: session.StatusStopped, RootImage: root('b')}, "changes.patch")
	fakeSession(t, c.Home, "done-1", session.State{Status: session.StatusStopped, RootImage: root('c')})
	// Recorded as running, its process gone: crashed, with its scratch disk.
	fakeSession(t, c.Home, "crashed-1", session.State{Status: session.StatusRunning, PID: 1 << 30, RootImage: root('d')}, "scratch.img")
	// Paused, its host process alive (this one): it may boot any image of its arch.
	fakeSession(t, c.Home, "paused-1", session.State{Status: session.StatusPaused, PID: os.Getpid(), Arch: string(other), RootImage: root('e')})

	wantRemoved := []string{stale, deadBuild, image.RootDir + "/" + sha('a') + ".ext4", image.RootDir + "/" + sha('c') + ".ext4"}
	slices.Sort(wantRemoved)

	t.Run("list", func(t *testing.T) {
		r := runImages(t, c)
		keep := map[string]bool{}
		var unneeded int64
		for _, e := range r.Entries {
			keep[e.Name] = e.Keep
			if e.Keep && len(e.Why) == 0 {
				t.Errorf("%s kept without a reason", e.Name)
			}
			if !e.Keep {
				unneeded += e.Size
			}
		}
		want := map[string]bool{current: true, stale: false, otherBoot: true, filepath.Base(planted): true, deadBuild: false, liveBuild: true}
		for r, k := range map[byte]bool{'a': false, 'b': true, 'c': false, 'd': true, 'e': true, 'f': true} {
			want[image.RootDir+"/"+sha(r)+".ext4"] = k
		}
		for name, k := range want {
			got, ok := keep[name]
			if !ok || got != k {
				t.Errorf("%s: listed %v, keep %v; want keep %v", name, ok, got, k)
			}
		}
		if len(keep) != len(want) {
			t.Errorf("listed %v, want %v", keep, want)
		}
		if r.Unneeded != unneeded || unneeded == 0 {
			t.Errorf("unneeded_bytes %d, want %d", r.Unneeded, unneeded)
		}
	})

	t.Run("dry run changes nothing", func(t *testing.T) {
		before := tree(t, images)
		r := runImages(t, c, "prune", "--dry-run")
		if got := r.removed(); !slices.Equal(got, wantRemoved) || !r.DryRun {
			t.Errorf("dry run would remove %v, want %v", got, wantRemoved)
		}
		if after := tree(t, images); !slices.Equal(before, after) {
			t.Errorf("dry run changed the cache:\nbefore %v\nafter  %v", before, after)
		}
	})

	t.Run("prune", func(t *testing.T) {
		r := runImages(t, c, "prune")
		if got := r.removed(); !slices.Equal(got, wantRemoved) || r.Freed == 0 {
			t.Errorf("removed %v (%d bytes), want %v", got, r.Freed, wantRemoved)
		}
		for _, p := range []string{filepath.Join(images, stale), root('a'), root('c'), index, filepath.Join(images, deadBuild)} {
			if _, err := os.Lstat(p); err == nil {
				t.Errorf("%s is still there", p)
			}
		}
		for _, p := range []string{cur.Kernel, cur.Initrd, filepath.Join(images, otherBoot), root('b'), root('d'), root('e'),
			root('f'), planted, secret, filepath.Join(images, "notes.txt"), filepath.Join(images, liveBuild)} {
			if _, err := os.Lstat(p); err != nil {
				t.Errorf("kept %s: %v", p, err)
			}
		}
		if b, err := os.ReadFile(secret); err != nil || string(b) != "not the cache's" {
			t.Errorf("the file outside the cache: %q, %v", b, err)
		}
		// The current image is still good for a session.
		if _, err := image.Ensure(t.Context(), images, image.NewDebianTest(a, nil)); err != nil {
			t.Error(err)
		}
		stdout, stderr, code := c.Run(t, "", "images", "prune")
		if code != 0 || !strings.Contains(stdout, "freed 0 KiB") {
			t.Errorf("second prune: exit %d\n%s%s", code, stdout, stderr)
		}
	})
}

// A prune waits for a build that holds a recipe's lock in another process,
// then prunes.
func TestImagesPruneWaitsForBuildLock(t *testing.T) {
	t.Parallel()
	c, images := imagesCLI(t)
	stale := "debian-test-amd64-00000000deadbeef"
	fakeBoot(t, images, stale, vm.ArchAMD64)
	lock, err := os.OpenFile(filepath.Join(images, ".debian-test-amd64.lock"), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	cmd := c.Command(t, nil, "images", "prune")
	errPipe, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	cmd.Stdout = &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(errPipe)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	waiting := false
	for l := range lines {
		if strings.Contains(l, "waiting for it to finish") && strings.Contains(l, ".debian-test-amd64.lock") {
			waiting = true
			break
		}
		t.Logf("stderr: %s", l)
	}
	if !waiting {
		cmd.Wait()
		t.Fatalf("prune did not wait for the lock; stdout:\n%s", out.String())
	}
	// Waiting, it has removed nothing.
	if _, err := os.Stat(filepath.Join(images, stale)); err != nil {
		t.Fatalf("removed while the build held the lock: %v", err)
	}
	syscall.Flock(int(lock.Fd()), syscall.LOCK_UN)
	for range lines {
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("prune: %v\n%s", err, out.String())
	}
	if _, err := os.Stat(filepath.Join(images, stale)); err == nil {
		t.Errorf("not pruned after the build ended:\n%s", out.String())
	}
}

// init says, in one line, when unneeded images take more than 1 GiB, and
// removes nothing.
func TestInitWarnsOfUnneededImages(t *testing.T) {
	t.Parallel()
	c, images := imagesCLI(t)
	big := filepath.Join(images, image.RootDir, sha('a')+".ext4")
	f, err := os.Create(big)
	if err != nil {
		t.Fatal(err)
	}
	// Sparse: the size counts, the disk is not filled.
	if err := f.Truncate(1<<30 + 1<<20); err != nil {
		t.Fatal(err)
	}
	f.Close()
	_, stderr, code := c.Run(t, "", "init", "--no-image")
	if code != 0 && code != 1 {
		t.Fatalf("init: exit %d\n%s", code, stderr)
	}
	if n := strings.Count(stderr, "`vibedom images prune`"); n != 1 {
		t.Errorf("init named `vibedom images prune` %d times:\n%s", n, stderr)
	}
	if _, err := os.Stat(big); err != nil {
		t.Errorf("init removed an image: %v", err)
	}
	os.Remove(big)
	_, stderr, _ = c.Run(t, "", "init", "--no-image")
	if strings.Contains(stderr, "images prune") {
		t.Errorf("init warned with nothing to prune:\n%s", stderr)
	}
}
