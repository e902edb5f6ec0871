package vz

import (
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vibedom/vibedom/vm"
)

// arm64Image returns the first bytes of a plausible uncompressed arm64 Image.
func arm64Image() []byte {
	b := make([]byte, 4096)
	binary.LittleEndian.PutUint32(b[arm64MagicOffset:], arm64Magic)
	return b
}

// zbootImage returns the head of an EFI zboot kernel with a gzip payload.
func zbootImage() []byte {
	b := make([]byte, 4096)
	copy(b, "MZ")
	copy(b[4:], "zimg")
	copy(b[zbootTypeOffset:], "gzip")
	return b
}

// bzImage returns the head of an x86 bzImage: "HdrS" at 0x202, no arm64 magic.
func bzImage() []byte {
	b := make([]byte, 4096)
	b[0x1fe], b[0x1ff] = 0x55, 0xaa
	copy(b[0x202:], "HdrS")
	return b
}

var testLimits = limits{minCPUs: 1, maxCPUs: 8, minMem: 128 << 20, maxMem: 16 << 30}

// fixture writes the files a valid config points at and returns the config.
func fixture(t *testing.T) vm.Config {
	t.Helper()
	dir := t.TempDir()
	write := func(name string, data []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, data, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	ws := filepath.Join(dir, "workspace")
	state := filepath.Join(dir, "state")
	for _, d := range []string{ws, state} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	return vm.Config{
		Name:       "test",
		Arch:       vm.ArchARM64,
		CPUs:       2,
		MemoryMiB:  1024,
		Kernel:     write("Image", arm64Image()),
		Initrd:     write("initrd.cpio", []byte("070701")),
		Cmdline:    "quiet",
		Shares:     []vm.Share{{Tag: "workspace", HostPath: ws, ReadOnly: true}},
		Disks:      []vm.Disk{{Path: write("scratch.img", make([]byte, 1<<16))}},
		ConsoleLog: filepath.Join(dir, "console.log"),
		StateDir:   state,
	}
}

func TestNewPlan(t *testing.T) {
	tests := []struct {
		name    string
		modify  func(t *testing.T, c *vm.Config)
		wantErr []error // each must match with errors.Is; nil means success
		wantMsg string  // substring of the error
	}{
		{name: "valid", modify: func(*testing.T, *vm.Config) {}},
		{
			name:    "amd64 guest is unavailable",
			modify:  func(_ *testing.T, c *vm.Config) { c.Arch = vm.ArchAMD64 },
			wantErr: []error{vm.ErrUnavailable},
			wantMsg: "arm64",
		},
		{
			name:    "too many cpus",
			modify:  func(_ *testing.T, c *vm.Config) { c.CPUs = 9 },
			wantErr: []error{vm.ErrInvalidConfig},
			wantMsg: "between 1 and 8",
		},
		{
			name:    "zero cpus caught by vm.Config",
			modify:  func(_ *testing.T, c *vm.Config) { c.CPUs = 0 },
			wantErr: []error{vm.ErrInvalidConfig},
		},
		{
			name:    "too much memory",
			modify:  func(_ *testing.T, c *vm.Config) { c.MemoryMiB = 32 << 10 },
			wantErr: []error{vm.ErrInvalidConfig},
			wantMsg: "16384 MiB",
		},
		{
			name:   "smallest machine",
			modify: func(_ *testing.T, c *vm.Config) { c.CPUs, c.MemoryMiB = 1, 128 },
		},
		{
			name: "gzip kernel",
			modify: func(t *testing.T, c *vm.Config) {
				if err := os.WriteFile(c.Kernel, []byte{0x1f, 0x8b, 8, 0, 0, 0}, 0o600); err != nil {
					t.Fatal(err)
				}
			},
			wantErr: []error{vm.ErrInvalidConfig, ErrKernelFormat},
			wantMsg: "gunzip",
		},
		{
			name:    "missing kernel caught by vm.Config",
			modify:  func(_ *testing.T, c *vm.Config) { c.Kernel += ".missing" },
			wantErr: []error{vm.ErrInvalidConfig},
		},
		{
			name:    "multicast MAC",
			modify:  func(_ *testing.T, c *vm.Config) { c.Network = &vm.Network{Conn: os.Stdin, MAC: "01:00:5e:00:00:01"} },
			wantErr: []error{vm.ErrInvalidConfig},
			wantMsg: "multicast",
		},
		{
			name:    "console log in a missing directory",
			modify:  func(_ *testing.T, c *vm.Config) { c.ConsoleLog = filepath.Join(c.StateDir, "nope", "console.log") },
			wantErr: []error{vm.ErrInvalidConfig},
			wantMsg: "console log",
		},
		{
			name:    "command line with a line break",
			modify:  func(_ *testing.T, c *vm.Config) { c.Cmdline = "quiet\ninit=/bin/sh" },
			wantErr: []error{vm.ErrInvalidConfig},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := fixture(t)
			tt.modify(t, &cfg)
			p, err := newPlan(cfg, testLimits)
			if tt.wantErr == nil {
				if err != nil {
					t.Fatalf("newPlan: got error %v, want none", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("newPlan: got plan %+v, want an error", p)
			}
			for _, want := range tt.wantErr {
				if !errors.Is(err, want) {
					t.Errorf("newPlan error %q: does not wrap %v", err, want)
				}
			}
			if !strings.Contains(err.Error(), tt.wantMsg) {
				t.Errorf("newPlan error %q: does not mention %q", err, tt.wantMsg)
			}
		})
	}
}

func TestNewPlanValues(t *testing.T) {
	cfg := fixture(t)
	cfg.Network = &vm.Network{Conn: os.Stdin, MAC: "52:54:00:12:34:56"}
	p, err := newPlan(cfg, testLimits)
	if err != nil {
		t.Fatal(err)
	}
	checks := []struct {
		name      string
		got, want any
	}{
		{"cmdline", p.cmdline, "quiet console=hvc0"},
		{"cpus", p.cpus, uint(2)},
		{"memory", p.memBytes, uint64(1 << 30)},
		{"control port", p.controlPort, vm.DefaultControlPort},
		{"mac", p.mac.String(), "52:54:00:12:34:56"},
		{"shares", len(p.shares), 1},
		{"share read-only", p.shares[0].ReadOnly, true},
		{"disks", len(p.disks), 1},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s: got %v, want %v", c.name, c.got, c.want)
		}
	}

	cfg.ControlPort = 5000
	cfg.Network.MAC = ""
	p, err = newPlan(cfg, testLimits)
	if err != nil {
		t.Fatal(err)
	}
	if p.controlPort != 5000 {
		t.Errorf("control port: got %d, want 5000", p.controlPort)
	}
	if p.mac != nil {
		t.Errorf("mac: got %v, want nil (random)", p.mac)
	}
}

func TestCheckKernelHeader(t *testing.T) {
	tests := []struct {
		name    string
		head    []byte
		wantErr bool
		wantMsg string
	}{
		{"arm64 Image", arm64Image(), false, ""},
		{"gzip", append([]byte{0x1f, 0x8b, 0x08}, make([]byte, 100)...), true, "gzip-compressed"},
		{"zstd", append([]byte{0x28, 0xb5, 0x2f, 0xfd}, make([]byte, 100)...), true, "zstd-compressed"},
		{"xz", append([]byte{0xfd, '7', 'z', 'X', 'Z', 0}, make([]byte, 100)...), true, "xz-compressed"},
		{"EFI zboot", zbootImage(), true, "zboot image (gzip"},
		{"x86 bzImage", bzImage(), true, "no arm64 Image magic"},
		{"ELF vmlinux", append([]byte{0x7f, 'E', 'L', 'F'}, make([]byte, 100)...), true, "no arm64 Image magic"},
		{"too short", []byte{0, 0, 0, 0}, true, "too short"},
		{"empty", nil, true, "too short"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := checkKernelHeader("/k", tt.head)
			if (err != nil) != tt.wantErr {
				t.Fatalf("checkKernelHeader: got %v, want error %v", err, tt.wantErr)
			}
			if err == nil {
				return
			}
			if !errors.Is(err, ErrKernelFormat) || !errors.Is(err, vm.ErrInvalidConfig) {
				t.Errorf("error %q: want it to wrap ErrKernelFormat and vm.ErrInvalidConfig", err)
			}
			if !strings.Contains(err.Error(), tt.wantMsg) {
				t.Errorf("error %q: does not mention %q", err, tt.wantMsg)
			}
		})
	}
}

func TestCheckKernelFile(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "Image")
	if err := os.WriteFile(good, arm64Image(), 0o600); err != nil {
		t.Fatal(err)
	}
	short := filepath.Join(dir, "short")
	if err := os.WriteFile(short, []byte("ARM"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		path    string
		wantErr bool
	}{
		{"good", good, false},
		{"short file", short, true},
		{"missing", filepath.Join(dir, "missing"), true},
		{"directory", dir, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := checkKernelFile(tt.path)
			if (err != nil) != tt.wantErr {
				t.Fatalf("checkKernelFile(%s): got %v, want error %v", tt.path, err, tt.wantErr)
			}
			if err != nil && !errors.Is(err, vm.ErrInvalidConfig) {
				t.Errorf("error %q does not wrap vm.ErrInvalidConfig", err)
			}
		})
	}
}

func TestKernelCmdline(t *testing.T) {
	tests := []struct {
		name, in, want string
		wantErr        bool
	}{
		{"empty", "", "console=hvc0", false},
		{"extra args", "quiet loglevel=3", "quiet loglevel=3 console=hvc0", false},
		{"already there", "console=hvc0 quiet", "console=hvc0 quiet", false},
		{"other console keeps hvc0 last", "console=ttyAMA0", "console=ttyAMA0 console=hvc0", false},
		{"whitespace normalised", "  a \t b  ", "a b console=hvc0", false},
		{"similar but different arg", "console=hvc0,115200", "console=hvc0,115200 console=hvc0", false},
		{"NUL", "a\x00b", "", true},
		{"newline", "a\nb", "", true},
		{"too long", strings.Repeat("x", maxCmdline), "", true},
		{"longest allowed", strings.Repeat("x", maxCmdline-len(" console=hvc0")), strings.Repeat("x", maxCmdline-len(" console=hvc0")) + " console=hvc0", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := kernelCmdline(tt.in)
			if (err != nil) != tt.wantErr {
				t.Fatalf("kernelCmdline(%q): got error %v, want error %v", tt.in, err, tt.wantErr)
			}
			if err != nil {
				if !errors.Is(err, vm.ErrInvalidConfig) {
					t.Errorf("error %q does not wrap vm.ErrInvalidConfig", err)
				}
				return
			}
			if got != tt.want {
				t.Errorf("kernelCmdline(%q): got %q, want %q", tt.in, got, tt.want)
			}
		})
	}
}

func TestParseMAC(t *testing.T) {
	tests := []struct {
		name, in, want string
		wantErr        bool
	}{
		{"empty chooses", "", "", false},
		{"qemu style", "52:54:00:12:34:56", "52:54:00:12:34:56", false},
		{"dashes", "52-54-00-AB-CD-EF", "52:54:00:ab:cd:ef", false},
		{"globally administered unicast", "00:1c:42:00:00:01", "00:1c:42:00:00:01", false},
		{"multicast", "01:00:5e:00:00:01", "", true},
		{"broadcast", "ff:ff:ff:ff:ff:ff", "", true},
		{"all zeros", "00:00:00:00:00:00", "", true},
		{"EUI-64", "02:00:00:00:00:00:00:01", "", true},
		{"garbage", "not-a-mac", "", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseMAC(tt.in)
			if (err != nil) != tt.wantErr {
				t.Fatalf("parseMAC(%q): got error %v, want error %v", tt.in, err, tt.wantErr)
			}
			if err != nil {
				if !errors.Is(err, vm.ErrInvalidConfig) {
					t.Errorf("error %q does not wrap vm.ErrInvalidConfig", err)
				}
				return
			}
			s := ""
			if got != nil {
				s = got.String()
			}
			if s != tt.want {
				t.Errorf("parseMAC(%q): got %q, want %q", tt.in, s, tt.want)
			}
		})
	}
}

func TestCheckMacOSVersion(t *testing.T) {
	tests := []struct {
		in      string
		wantErr bool
	}{
		{"15.1", false},
		{"14.4.1", false},
		{"14", false},
		{"13.6.9", true},
		{"12.0", true},
		{"11.7.10", true},
		{"10.15.7", true},
		{"", true},
		{"abc", true},
		{"14.x", true},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			err := checkMacOSVersion(tt.in)
			if (err != nil) != tt.wantErr {
				t.Fatalf("checkMacOSVersion(%q): got %v, want error %v", tt.in, err, tt.wantErr)
			}
			if err != nil && !errors.Is(err, vm.ErrUnavailable) {
				t.Errorf("error %q does not wrap vm.ErrUnavailable", err)
			}
		})
	}
}

func TestClassifyValidateError(t *testing.T) {
	tests := []struct {
		name    string
		in      error
		want    error
		wantMsg string
	}{
		{
			name:    "missing entitlement",
			in:      errors.New(`Error Domain=VZErrorDomain Code=2 Description="Invalid virtual machine configuration. The process doesn’t have the “com.apple.security.virtualization” entitlement."`),
			want:    vm.ErrUnavailable,
			wantMsg: "codesign",
		},
		{
			name:    "bad config",
			in:      errors.New(`Error Domain=VZErrorDomain Code=2 Description="Invalid virtual machine configuration. The memory size must be a multiple of 1 MB."`),
			want:    vm.ErrInvalidConfig,
			wantMsg: "multiple of 1 MB",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := classifyValidateError(tt.in)
			if !errors.Is(err, tt.want) {
				t.Errorf("classifyValidateError: got %v, want it to wrap %v", err, tt.want)
			}
			if !strings.Contains(err.Error(), tt.wantMsg) {
				t.Errorf("classifyValidateError: %q does not mention %q", err, tt.wantMsg)
			}
		})
	}
}

// TestBalloonTarget: a wish becomes whole MiB in bytes, never above the
// machine's memory nor below the smallest machine.
func TestBalloonTarget(t *testing.T) {
	p := plan{memBytes: 2048 << 20}
	for _, c := range []struct{ mib, want int }{
		{1024, 1024}, {2048, 2048}, {4096, 2048}, {127, 128}, {0, 128}, {-5, 128},
	} {
		if got := p.balloonTarget(c.mib); got != uint64(c.want)<<20 {
			t.Errorf("balloonTarget(%d) = %d MiB, want %d MiB", c.mib, got>>20, c.want)
		}
	}
}

// TestInfoNoFreePageReporting: vz does not take freed memory back by
// itself, so sessions steer its balloon.
func TestInfoNoFreePageReporting(t *testing.T) {
	if (&Driver{}).Info().FreePageReporting {
		t.Error("Info().FreePageReporting is true on vz")
	}
}
