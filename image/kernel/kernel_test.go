package kernel

import (
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/vibedom/vibedom/vm"
)

func fakeKernel(magicAt int, magic string) []byte {
	k := bytes.Repeat([]byte{0x90}, 64<<10)
	copy(k[magicAt:], magic)
	return k
}

func gz(t *testing.T, data []byte) []byte {
	t.Helper()
	var b bytes.Buffer
	w := gzip.NewWriter(&b)
	w.Write(data)
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// zbootWrap wraps payload the way the kernel's EFI zboot does: a PE stub
// whose header says where the compressed kernel is.
func zbootWrap(payload []byte, comp string, offset int, sizeDelta int) []byte {
	f := make([]byte, offset+len(payload)+512)
	copy(f, "MZ\x00\x00zimg")
	binary.LittleEndian.PutUint32(f[8:], uint32(offset))
	binary.LittleEndian.PutUint32(f[12:], uint32(len(payload)+sizeDelta))
	copy(f[24:], comp+"\x00")
	copy(f[offset:], payload)
	return f
}

func TestWriteKernel(t *testing.T) {
	t.Parallel()
	bz := fakeKernel(0x202, "HdrS")
	arm := fakeKernel(56, "ARM\x64")
	zboot := zbootWrap(gz(t, arm), "gzip", 4096, 0)
	tests := []struct {
		name    string
		arch    vm.Arch
		in      []byte
		want    []byte // nil: an error is expected
		wantErr error
	}{
		{"x86 bzImage", vm.ArchAMD64, bz, bz, nil},
		{"arm64 Image", vm.ArchARM64, arm, arm, nil},
		{"arm64 Image.gz is unpacked", vm.ArchARM64, gz(t, arm), arm, nil},
		{"gzipped x86 kernel", vm.ArchAMD64, gz(t, bz), nil, ErrBad},
		{"arm64 EFI zboot is unwrapped", vm.ArchARM64, zboot, arm, nil},
		{"zboot with zstd", vm.ArchARM64, zbootWrap(gz(t, arm), "zstd", 4096, 0), nil, ErrBad},
		{"zboot payload past the end", vm.ArchARM64, zbootWrap(gz(t, arm), "gzip", 4096, 1<<20), nil, ErrBad},
		{"zboot payload inside the header", vm.ArchARM64, zbootWrap(gz(t, arm), "gzip", 8, 0), nil, ErrBad},
		{"zboot payload not gzip", vm.ArchARM64, zbootWrap(arm, "gzip", 4096, 0), nil, ErrBad},
		{"zboot holding no arm64 Image", vm.ArchARM64, zbootWrap(gz(t, bz), "gzip", 4096, 0), nil, ErrBad},
		{"zboot for x86", vm.ArchAMD64, zboot, nil, ErrBad},
		{"x86 kernel for arm64", vm.ArchARM64, bz, nil, ErrBad},
		{"arm64 kernel for x86", vm.ArchAMD64, arm, nil, ErrBad},
		{"truncated gzip", vm.ArchARM64, gz(t, arm)[:100], nil, nil},
		{"tiny file", vm.ArchAMD64, []byte("MZ"), nil, ErrBad},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			src := filepath.Join(dir, "vmlinuz")
			os.WriteFile(src, tt.in, 0o644)
			dst := filepath.Join(dir, "kernel")
			err := Write(dst, src, tt.arch)
			if tt.want == nil {
				if err == nil {
					t.Fatalf("writeKernel accepted it")
				}
				if tt.wantErr != nil && !errors.Is(err, tt.wantErr) {
					t.Errorf("writeKernel: got %v, want %v", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("writeKernel: %v", err)
			}
			got, _ := os.ReadFile(dst)
			if !bytes.Equal(got, tt.want) {
				t.Errorf("kernel written: %d bytes, want %d identical bytes", len(got), len(tt.want))
			}
		})
	}
}
