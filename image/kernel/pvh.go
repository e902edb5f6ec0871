package kernel

import (
	"bytes"
	"compress/gzip"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os/exec"

	"github.com/klauspost/compress/zstd"
	"github.com/ulikunitz/xz"

	"github.com/vibedom/vibedom/childenv"
)

// maxVmlinux bounds the decompressed kernel.
const maxVmlinux = 512 << 20

// pvhKernel returns the uncompressed vmlinux inside an x86 bzImage when it
// can be booted directly through the PVH entry point (CONFIG_PVH): QEMU
// then skips the firmware's real-mode boot and the kernel's
// self-decompression, which under emulation take seconds. ok is false (and
// the bzImage should be used as is) when the kernel has no PVH entry or a
// compression this package does not read.
func pvhKernel(bz []byte) (vmlinux []byte, ok bool, err error) {
	if len(bz) < 0x250 || string(bz[0x202:0x206]) != "HdrS" {
		return nil, false, fmt.Errorf("%w: not an x86 bzImage", ErrBad)
	}
	if binary.LittleEndian.Uint16(bz[0x206:]) < 0x208 {
		return nil, false, nil // boot protocol too old to locate the payload
	}
	setupSects := int(bz[0x1f1])
	if setupSects == 0 {
		setupSects = 4
	}
	start := (setupSects + 1) * 512
	off := int(binary.LittleEndian.Uint32(bz[0x248:]))
	n := int(binary.LittleEndian.Uint32(bz[0x24c:]))
	if off < 0 || n <= 0 || start+off+n > len(bz) || start+off+n < start {
		return nil, false, nil // no payload we can locate: boot the bzImage
	}
	payload := bz[start+off : start+off+n]
	data, err := decompressPayload(payload)
	if err != nil || data == nil {
		return nil, false, nil // a payload we cannot read: boot the bzImage
	}
	if !HasPVHNote(data) {
		return nil, false, nil
	}
	return data, true, nil
}

// decompressPayload unpacks a kernel payload; nil data means an unknown
// format.
func decompressPayload(payload []byte) ([]byte, error) {
	var r io.Reader
	switch {
	case bytes.HasPrefix(payload, []byte{0xfd, '7', 'z', 'X', 'Z', 0}):
		// Kernels use xz's x86 BCJ filter, which the Go decoder lacks, so
		// the xz program is tried first.
		if data, err := unxzCommand(payload); err == nil {
			return data, nil
		}
		xr, err := xz.NewReader(bytes.NewReader(payload))
		if err != nil {
			return nil, err
		}
		r = xr
	case bytes.HasPrefix(payload, []byte{0x1f, 0x8b}):
		gr, err := gzip.NewReader(bytes.NewReader(payload))
		if err != nil {
			return nil, err
		}
		r = gr
	case bytes.HasPrefix(payload, []byte{0x28, 0xb5, 0x2f, 0xfd}):
		zr, err := zstd.NewReader(bytes.NewReader(payload))
		if err != nil {
			return nil, err
		}
		defer zr.Close()
		r = zr
	default:
		return nil, nil
	}
	var out bytes.Buffer
	if _, err := io.Copy(&limitWriter{w: &out, n: maxVmlinux}, r); err != nil && !errors.Is(err, io.ErrUnexpectedEOF) {
		return nil, err
	}
	return out.Bytes(), nil
}

// HasPVHNote reports whether data is an x86-64 ELF with a Xen
// PHYS32_ENTRY note, the PVH entry point QEMU boots.
func HasPVHNote(data []byte) bool {
	f, err := elf.NewFile(bytes.NewReader(data))
	if err != nil || f.Machine != elf.EM_X86_64 {
		return false
	}
	for _, p := range f.Progs {
		if p.Type != elf.PT_NOTE {
			continue
		}
		notes, err := io.ReadAll(io.LimitReader(p.Open(), 1<<20))
		if err != nil {
			continue
		}
		for len(notes) >= 12 {
			nameSz := int(binary.LittleEndian.Uint32(notes[0:]))
			descSz := int(binary.LittleEndian.Uint32(notes[4:]))
			typ := binary.LittleEndian.Uint32(notes[8:])
			name := (nameSz + 3) &^ 3 // ELF note fields are 4-byte aligned
			desc := (descSz + 3) &^ 3
			if nameSz < 0 || descSz < 0 || 12+name+desc > len(notes) {
				break
			}
			if typ == 18 && nameSz >= 3 && string(notes[12:15]) == "Xen" { // XEN_ELFNOTE_PHYS32_ENTRY
				return true
			}
			notes = notes[12+name+desc:]
		}
	}
	return false
}

// unxzCommand decompresses one xz stream with the xz program.
func unxzCommand(payload []byte) ([]byte, error) {
	path, err := exec.LookPath("xz")
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(path, "-dc", "--single-stream")
	cmd.Env = childenv.Environ()
	cmd.Stdin = bytes.NewReader(payload)
	var out bytes.Buffer
	cmd.Stdout = &limitWriter{w: &out, n: maxVmlinux}
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("xz: %w", err)
	}
	return out.Bytes(), nil
}

type limitWriter struct {
	w io.Writer
	n int
}

func (l *limitWriter) Write(p []byte) (int, error) {
	if len(p) > l.n {
		return 0, errors.New("output too large")
	}
	l.n -= len(p)
	return l.w.Write(p)
}
