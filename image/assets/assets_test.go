package assets

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vibedom/vibedom/vm"
)

// makeAssetDir creates dir/<arch>/kernel/ and dir/<arch>/busybox.
func makeAssetDir(t *testing.T, dir string, arch vm.Arch) {
	t.Helper()
	if err := os.MkdirAll(filepath.Join(dir, string(arch), "kernel"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, string(arch), "busybox"), []byte("bb"), 0o755); err != nil {
		t.Fatal(err)
	}
}

func touchFile(t *testing.T, p string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte("guest"), 0o755); err != nil {
		t.Fatal(err)
	}
}

func TestLocateAssets(t *testing.T) {
	const arch = vm.ArchARM64
	guestName := "vibedom-guest-linux-arm64"
	tests := []struct {
		name string
		// setup returns the directory to chdir to and the expected
		// kernel dir and guest binary ("" when an error is expected).
		setup     func(t *testing.T, tmp string) (cwd, wantKernel, wantGuest string)
		wantErrIs error
		wantHint  string
	}{
		{
			name: "VIBEDOM_ASSETS and VIBEDOM_GUEST_BIN",
			setup: func(t *testing.T, tmp string) (string, string, string) {
				makeAssetDir(t, filepath.Join(tmp, "env"), arch)
				makeAssetDir(t, filepath.Join(tmp, "home", "assets"), arch) // loses
				touchFile(t, filepath.Join(tmp, "g"))
				t.Setenv(EnvAssets, filepath.Join(tmp, "env"))
				t.Setenv(EnvGuestBin, filepath.Join(tmp, "g"))
				return tmp, filepath.Join(tmp, "env", "arm64", "kernel"), filepath.Join(tmp, "g")
			},
		},
		{
			name: "VIBEDOM_HOME assets, guest walking up from the current directory",
			setup: func(t *testing.T, tmp string) (string, string, string) {
				makeAssetDir(t, filepath.Join(tmp, "home", "assets"), arch)
				makeAssetDir(t, filepath.Join(tmp, "repo", ".cache", "assets"), arch) // loses
				touchFile(t, filepath.Join(tmp, "repo", "bin", guestName))
				cwd := filepath.Join(tmp, "repo", "pkg", "sub")
				os.MkdirAll(cwd, 0o755)
				return cwd, filepath.Join(tmp, "home", "assets", "arm64", "kernel"), filepath.Join(tmp, "repo", "bin", guestName)
			},
		},
		{
			name: "repository cache walking up from the current directory",
			setup: func(t *testing.T, tmp string) (string, string, string) {
				makeAssetDir(t, filepath.Join(tmp, "repo", ".cache", "assets"), arch)
				touchFile(t, filepath.Join(tmp, "repo", "bin", guestName))
				cwd := filepath.Join(tmp, "repo", "a", "b", "c")
				os.MkdirAll(cwd, 0o755)
				return cwd, filepath.Join(tmp, "repo", ".cache", "assets", "arm64", "kernel"), filepath.Join(tmp, "repo", "bin", guestName)
			},
		},
		{
			name: "incomplete VIBEDOM_ASSETS does not fall back",
			setup: func(t *testing.T, tmp string) (string, string, string) {
				os.MkdirAll(filepath.Join(tmp, "env", "arm64", "kernel"), 0o755) // no busybox
				makeAssetDir(t, filepath.Join(tmp, "home", "assets"), arch)
				t.Setenv(EnvAssets, filepath.Join(tmp, "env"))
				return tmp, "", ""
			},
			wantErrIs: ErrNoAssets, wantHint: "fetch-assets.sh",
		},
		{
			name: "other arch only",
			setup: func(t *testing.T, tmp string) (string, string, string) {
				makeAssetDir(t, filepath.Join(tmp, "home", "assets"), vm.ArchAMD64)
				return tmp, "", ""
			},
			wantErrIs: ErrNoAssets, wantHint: "make assets",
		},
		{
			name: "nothing fetched",
			setup: func(t *testing.T, tmp string) (string, string, string) {
				return tmp, "", ""
			},
			wantErrIs: ErrNoAssets, wantHint: "make assets",
		},
		{
			name: "no guest binary",
			setup: func(t *testing.T, tmp string) (string, string, string) {
				makeAssetDir(t, filepath.Join(tmp, "home", "assets"), arch)
				touchFile(t, filepath.Join(tmp, "bin", "vibedom-guest-linux-amd64")) // wrong arch
				return tmp, "", ""
			},
			wantErrIs: ErrNoGuest, wantHint: "make guest",
		},
		{
			name: "VIBEDOM_GUEST_BIN missing",
			setup: func(t *testing.T, tmp string) (string, string, string) {
				makeAssetDir(t, filepath.Join(tmp, "home", "assets"), arch)
				touchFile(t, filepath.Join(tmp, "bin", guestName)) // not a fallback
				t.Setenv(EnvGuestBin, filepath.Join(tmp, "nope"))
				return tmp, "", ""
			},
			wantErrIs: ErrNoGuest, wantHint: "make guest",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tmp, err := filepath.EvalSymlinks(t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			t.Setenv(EnvAssets, "")
			t.Setenv(EnvGuestBin, "")
			t.Setenv(EnvHome, filepath.Join(tmp, "home"))
			cwd, wantKernel, wantGuest := tt.setup(t, tmp)
			t.Chdir(cwd)
			a, err := Locate(arch)
			if tt.wantErrIs != nil {
				if !errors.Is(err, tt.wantErrIs) || !strings.Contains(err.Error(), tt.wantHint) {
					t.Fatalf("Locate: got %v, want %v saying %q", err, tt.wantErrIs, tt.wantHint)
				}
				return
			}
			if err != nil {
				t.Fatalf("Locate: %v", err)
			}
			if a.KernelDir != wantKernel || a.GuestBinary != wantGuest || a.Arch != arch {
				t.Errorf("got %+v, want kernel %s guest %s", a, wantKernel, wantGuest)
			}
			if a.Busybox != filepath.Join(filepath.Dir(wantKernel), "busybox") {
				t.Errorf("busybox: got %s", a.Busybox)
			}
		})
	}
	t.Run("unknown arch", func(t *testing.T) {
		if _, err := Locate("riscv64"); err == nil {
			t.Errorf("Locate accepted riscv64")
		}
	})
}
