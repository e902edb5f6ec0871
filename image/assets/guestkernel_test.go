package assets

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vibedom/vibedom/vm"
)

// makeGuestKernel creates dir/<arch>/guest-kernel/, finished (.complete)
// or not.
func makeGuestKernel(t *testing.T, dir string, arch vm.Arch, complete bool) string {
	t.Helper()
	g := filepath.Join(dir, string(arch), GuestKernelDir)
	touchFile(t, filepath.Join(g, "boot", "vmlinuz-6.1.192-vibedom"))
	touchFile(t, filepath.Join(g, "lib", "modules", "6.1.192-vibedom", "modules.builtin"))
	if complete {
		touchFile(t, filepath.Join(g, ".complete"))
	}
	return g
}

// The test image boots vibedom's own guest kernel when its build finished,
// the distribution's when it did not or VIBEDOM_KERNEL=distro; a value
// that is neither is refused rather than guessed.
func TestLocateGuestKernel(t *testing.T) {
	const arch = vm.ArchAMD64
	tests := []struct {
		name       string
		env        string
		complete   bool
		wantKernel string // "guest", "distro" or "" (error)
		wantErr    string
	}{
		{name: "built", complete: true, wantKernel: "guest"},
		{name: "built, auto", env: "auto", complete: true, wantKernel: "guest"},
		{name: "interrupted build", complete: false, wantKernel: "distro"},
		{name: "distro asked for", env: "distro", complete: true, wantKernel: "distro"},
		{name: "typo", env: "vibedom", complete: true, wantErr: "use auto"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tmp := t.TempDir()
			env := filepath.Join(tmp, "env")
			makeAssetDir(t, env, arch)
			g := makeGuestKernel(t, env, arch, tt.complete)
			t.Setenv(EnvAssets, env)
			t.Setenv(EnvKernel, tt.env)
			t.Setenv(EnvHome, filepath.Join(tmp, "home"))
			kdir, _, err := LocateKernel(arch)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("LocateKernel: err %v, want one saying %q", err, tt.wantErr)
				}
				if CheckKernelEnv() == nil {
					t.Error("CheckKernelEnv accepted the typo")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			want := filepath.Join(env, string(arch), "kernel")
			if tt.wantKernel == "guest" {
				want = g
			}
			if kdir != want {
				t.Errorf("LocateKernel = %s, want %s", kdir, want)
			}
			gk := LocateGuestKernel(arch)
			if tt.wantKernel == "guest" && gk != g || tt.wantKernel == "distro" && gk != "" {
				t.Errorf("LocateGuestKernel = %q (want the %s kernel)", gk, tt.wantKernel)
			}
		})
	}
}

// With VIBEDOM_ASSETS set, a guest kernel elsewhere (the home's assets, a
// checkout's .cache) is not used; without it, the home's comes first. The
// current directory (the project a session runs on) never supplies the
// guest image's kernel, and a folder whose stamp is there but whose kernel
// is not is passed over.
func TestLocateGuestKernelPlaces(t *testing.T) {
	const arch = vm.ArchAMD64
	tmp := t.TempDir()
	home := filepath.Join(tmp, "home")
	repo := filepath.Join(tmp, "repo")
	hg := makeGuestKernel(t, filepath.Join(home, "assets"), arch, true)
	makeGuestKernel(t, filepath.Join(repo, ".cache", "assets"), arch, true)
	cwd := filepath.Join(repo, "sub")
	if err := os.MkdirAll(cwd, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Chdir(cwd)
	t.Setenv(EnvHome, home)
	t.Setenv(EnvKernel, "")

	t.Setenv(EnvAssets, filepath.Join(tmp, "empty"))
	if g := LocateGuestKernel(arch); g != "" {
		t.Errorf("VIBEDOM_ASSETS without a guest kernel: got %s", g)
	}
	t.Setenv(EnvAssets, "")
	if g := LocateGuestKernel(arch); g != hg {
		t.Errorf("got %q, want the home's %s", g, hg)
	}
	if err := os.RemoveAll(filepath.Join(hg, "boot")); err != nil {
		t.Fatal(err)
	}
	if g := LocateGuestKernel(arch); g != "" {
		t.Errorf("got %q: a stamped folder without a kernel, or the current directory's .cache", g)
	}
	// The test image's kernel still walks up from the current directory
	// (a development build run in its checkout), as before.
	makeAssetDir(t, filepath.Join(repo, ".cache", "assets"), arch)
	t.Setenv(EnvHome, filepath.Join(tmp, "other-home"))
	if k, _, err := LocateKernel(arch); err != nil || k != filepath.Join(repo, ".cache", "assets", string(arch), GuestKernelDir) {
		t.Errorf("LocateKernel = %q, %v", k, err)
	}
}
