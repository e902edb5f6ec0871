package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/vibedom/vibedom/image"
	"github.com/vibedom/vibedom/image/alpine"
	"github.com/vibedom/vibedom/image/alpine/alpinetest"
)

// TestGuestImageVM drives the whole guest image pipeline as a user does,
// on the host's arch: `vibedom init` against a mirror (the Debian-sourced
// test repository, since no Alpine mirror is reachable here) — index,
// verify, resolve, download, extract, root image, boot files — then
// `vibedom run` boots it and runs git as the agent user.
func TestGuestImageVM(t *testing.T) { guestImageE2E(t, runtime.GOARCH) }

// TestGuestImageArm64 is the same on an arm64 guest under TCG (`make
// e2e-arm64`): the zboot kernel unwrapped, arm64 modules, arm64 userland.
func TestGuestImageArm64(t *testing.T) {
	if os.Getenv("VIBEDOM_E2E_ARM64") == "" && runtime.GOARCH != "arm64" {
		t.Skip("arm64 guests under TCG are slow: `make e2e-arm64` runs this")
	}
	guestImageE2E(t, "arm64")
}

func guestImageE2E(t *testing.T, goarch string) {
	qemu := map[string]string{"amd64": "qemu-system-x86_64", "arm64": "qemu-system-aarch64"}[goarch]
	if _, err := exec.LookPath(qemu); err != nil {
		t.Skipf("%s not installed (make setup)", qemu)
	}
	arch, err := alpine.GuestArch(goarch)
	if err != nil {
		t.Fatal(err)
	}
	assets, err := alpinetest.FindAssets(arch)
	if err != nil {
		t.Skipf("no Debian userland for %s (scripts/fetch-assets.sh): %v", arch, err)
	}
	key, err := alpinetest.NewKey("e2e@vibedom-1.rsa.pub")
	if err != nil {
		t.Fatal(err)
	}
	repo, err := alpinetest.BuildDebianRepo(alpinetest.DebianOptions{Arch: arch, Assets: assets, Root: t.TempDir(), Key: key,
		CacheDir: alpinetest.CacheDirFor(assets)})
	if err != nil {
		t.Fatal(err)
	}
	srv := repo.Serve()
	defer srv.Close()
	keys := t.TempDir()
	os.MkdirAll(filepath.Join(keys, arch), 0o755)
	os.WriteFile(filepath.Join(keys, arch, key.Name), key.PublicPEM, 0o644)

	c := newCLI(t)
	c.env = append(c.env, "VIBEDOM_TEST_ALPINE_KEYS="+keys)

	// The real binary trusts only Alpine's keys, whatever the environment says.
	stdout, stderr, _ := c.runWith(t, vibedomBin(t), "", "init", "--arch", goarch, "--mirror", srv.URL, "--json")
	var refused struct {
		ImageError string `json:"image_error"`
		Image      any    `json:"image"`
	}
	if err := json.Unmarshal([]byte(stdout), &refused); err != nil {
		t.Fatalf("init --json: %v\n%s\n%s", err, stdout, stderr)
	}
	if refused.Image != nil || !strings.Contains(refused.ImageError, "signature") {
		t.Fatalf("the release binary accepted a test-signed mirror: %+v", refused)
	}

	bin := vibedomTestKeysBin(t)
	stdout, stderr, code := c.runWith(t, bin, "", "init", "--arch", goarch, "--mirror", srv.URL, "--json")
	if code != 0 {
		t.Fatalf("init: exit %d\n%s\n%s", code, stdout, stderr)
	}
	var r struct {
		Image struct {
			Root     string `json:"root_image"`
			RootSHA  string `json:"root_sha256"`
			Packages int    `json:"packages"`
			Built    bool   `json:"built"`
		} `json:"image"`
	}
	if err := json.Unmarshal([]byte(stdout), &r); err != nil {
		t.Fatalf("init --json: %v\n%s", err, stdout)
	}
	if r.Image.Root == "" || r.Image.Packages < 10 {
		t.Fatalf("init built no image: %s\n%s", stdout, stderr)
	}
	e2fsckImage(t, r.Image.Root)

	// Two sessions at once on the one image file: one as the agent user
	// (the default), one with --root.
	ws := sampleWorkspace(t)
	ws2 := sampleWorkspace(t)
	script := `id -u; id -un; echo "home=$HOME"; git --version; bash -c 'echo bash-ok'
cd /work && echo "made by the agent" > made.txt && rm obsolete.txt && echo appended >> notes.txt
cat /proc/self/status | grep ^CapEff`
	type out struct {
		stdout, stderr string
		code           int
	}
	rootDone := make(chan out, 1)
	go func() {
		o, e, code := c.runWith(t, bin, "", "run", ws2, "--arch", goarch, "--memory", "512M", "--no-network", "--no-review", "--root",
			"--", "sh", "-c", "id -u; echo x > /etc/written-by-root && cat /etc/written-by-root")
		rootDone <- out{o, e, code}
	}()
	stdout, stderr, code = c.runWith(t, bin, "", "run", ws, "--arch", goarch, "--memory", "512M", "--no-network", "--apply", "--", "sh", "-c", script)
	if code != 0 {
		t.Fatalf("run: exit %d\n%s\n%s", code, stdout, stderr)
	}
	t.Logf("in the guest:\n%s", stdout)
	for _, want := range []string{"\n1000\n", "\nagent\n", "home=/home/agent", "git version 2.", "bash-ok"} {
		if !strings.Contains("\n"+stdout, want) {
			t.Errorf("run output lacks %q:\n%s\n%s", want, stdout, stderr)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(ws, "made.txt")); string(b) != "made by the agent\n" {
		t.Errorf("made.txt after apply: %q", b)
	}
	if _, err := os.Stat(filepath.Join(ws, "obsolete.txt")); !os.IsNotExist(err) {
		t.Errorf("obsolete.txt survived the apply: %v", err)
	}
	// --root runs as root; writes to / land in the session's upper layer.
	r2 := <-rootDone
	if r2.code != 0 || !strings.Contains(r2.stdout, "0\nx\n") {
		t.Errorf("run --root: exit %d\n%s\n%s", r2.code, r2.stdout, r2.stderr)
	}
	// Nothing a session did changed the shared image.
	if err := image.VerifyRootImage(filepath.Join(c.home, "images"), r.Image.Root, r.Image.RootSHA, true); err != nil {
		t.Errorf("after two sessions: %v", err)
	}
	c.assertNothingLeft(t)
}

func e2fsckImage(t *testing.T, img string) {
	t.Helper()
	bin, err := exec.LookPath("e2fsck")
	if err != nil {
		bin = "/usr/sbin/e2fsck"
	}
	if _, err := os.Stat(bin); err != nil {
		t.Logf("e2fsck not installed: the root image's consistency is not checked")
		return
	}
	if out, err := exec.Command(bin, "-fn", img).CombinedOutput(); err != nil {
		t.Errorf("e2fsck -fn %s: %v\n%s", img, err, out)
	}
}
