package kernel

import (
	"bytes"
	"encoding/binary"
	"testing"
)

func TestPVHKernelFallsBack(t *testing.T) {
	t.Parallel()
	hdr := func(off, n uint32, total int) []byte {
		b := make([]byte, total)
		copy(b[0x202:], "HdrS")
		binary.LittleEndian.PutUint16(b[0x206:], 0x20f)
		b[0x1f1] = 1
		binary.LittleEndian.PutUint32(b[0x248:], off)
		binary.LittleEndian.PutUint32(b[0x24c:], n)
		return b
	}
	tests := []struct {
		name string
		bz   []byte
	}{
		{"payload beyond the file", hdr(0, 1<<20, 4096)},
		{"offset overflow", hdr(0xffffffff, 0xffffffff, 4096)},
		{"unknown compression", append(hdr(0, 16, 1024+16), bytes.Repeat([]byte{0x42}, 16)...)},
		{"corrupt gzip", append(hdr(0, 8, 1024+8), 0x1f, 0x8b, 1, 2, 3, 4, 5, 6)},
		{"gzip of a non-ELF", append(hdr(0, 0, 1024), []byte{}...)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, ok, err := pvhKernel(tt.bz)
			if err != nil || ok {
				t.Errorf("pvhKernel: ok=%v err=%v, want the bzImage to be kept", ok, err)
			}
		})
	}
	if _, _, err := pvhKernel([]byte("not a kernel")); err == nil {
		t.Errorf("a file without a boot header was accepted")
	}
}
