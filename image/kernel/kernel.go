package kernel

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/vibedom/vibedom/vm"
)

// ErrBad means a kernel file is not a bootable kernel for the
// image's architecture.
var ErrBad = errors.New("not a usable kernel image")

// Find finds boot/vmlinuz-<release> in an unpacked kernel package
// and the matching lib/modules/<release> directory.
func Find(kernelDir string) (vmlinuz, release string, err error) {
	matches, err := filepath.Glob(filepath.Join(kernelDir, "boot", "vmlinuz-*"))
	if err != nil {
		return "", "", err
	}
	var found []string
	for _, m := range matches {
		rel := strings.TrimPrefix(filepath.Base(m), "vmlinuz-")
		if fi, err := os.Stat(filepath.Join(kernelDir, "lib", "modules", rel)); err == nil && fi.IsDir() {
			found = append(found, m)
		}
	}
	switch len(found) {
	case 0:
		return "", "", fmt.Errorf("no boot/vmlinuz-<release> with a lib/modules/<release> in %s: run `make assets` (scripts/fetch-assets.sh)", kernelDir)
	case 1:
		return found[0], strings.TrimPrefix(filepath.Base(found[0]), "vmlinuz-"), nil
	default:
		return "", "", fmt.Errorf("%d kernels in %s (%s): keep one", len(found), kernelDir, strings.Join(found, ", "))
	}
}

// Write copies the kernel at src to dst in the form the hypervisors
// boot: an x86 bzImage as is; an arm64 kernel as an uncompressed Image,
// gunzipping it first if it is gzip-compressed (vz cannot boot a
// compressed arm64 kernel). It checks the result's boot header.
func Write(dst, src string, arch vm.Arch) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	if arch == vm.ArchAMD64 {
		bz, err := io.ReadAll(io.LimitReader(in, 256<<20))
		if err != nil {
			return err
		}
		if err := CheckHeader(bz, arch, src); err != nil {
			return err
		}
		vmlinux, ok, err := pvhKernel(bz)
		if err != nil {
			return fmt.Errorf("%s: %w", src, err)
		}
		if !ok {
			vmlinux = bz
		}
		if err := os.WriteFile(dst, vmlinux, 0o644); err != nil {
			return fmt.Errorf("write kernel %s: %w", dst, err)
		}
		return nil
	}
	br := bufio.NewReaderSize(in, 1<<20)
	var r io.Reader = br
	if head, _ := br.Peek(zbootHeaderLen); isZboot(head) {
		if arch != vm.ArchARM64 {
			return fmt.Errorf("%w: %s is an EFI zboot kernel; only arm64 kernels are unwrapped", ErrBad, src)
		}
		payload, err := zbootPayload(in, head, src)
		if err != nil {
			return err
		}
		gz, err := gzip.NewReader(payload)
		if err != nil {
			return fmt.Errorf("%w: %s: zboot payload: %v", ErrBad, src, err)
		}
		defer gz.Close()
		r = gz
	} else if magic, _ := br.Peek(2); len(magic) == 2 && magic[0] == 0x1f && magic[1] == 0x8b {
		if arch != vm.ArchARM64 {
			return fmt.Errorf("%w: %s is gzip-compressed; only arm64 kernels are unpacked", ErrBad, src)
		}
		gz, err := gzip.NewReader(br)
		if err != nil {
			return fmt.Errorf("%w: %s: %v", ErrBad, src, err)
		}
		defer gz.Close()
		r = gz
	}
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return err
	}
	// Keep the head for the header check.
	var head bytes.Buffer
	hw := &headWriter{buf: &head, max: 4096}
	_, err = io.Copy(io.MultiWriter(out, hw), r)
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write kernel %s: %w", dst, err)
	}
	return CheckHeader(head.Bytes(), arch, src)
}

type headWriter struct {
	buf *bytes.Buffer
	max int
}

func (h *headWriter) Write(p []byte) (int, error) {
	if n := h.max - h.buf.Len(); n > 0 {
		h.buf.Write(p[:min(n, len(p))])
	}
	return len(p), nil
}

// CheckHeader checks the boot header of an (uncompressed) kernel:
// "HdrS" at 0x202 for an x86 bzImage, "ARM\x64" at 56 for an arm64 Image.
func CheckHeader(head []byte, arch vm.Arch, src string) error {
	switch arch {
	case vm.ArchAMD64:
		if len(head) >= 0x206 && string(head[0x202:0x206]) == "HdrS" {
			return nil
		}
		return fmt.Errorf("%w: %s is not an x86 bzImage", ErrBad, src)
	case vm.ArchARM64:
		if isZboot(head) {
			return fmt.Errorf("%w: %s holds an EFI zboot kernel inside an EFI zboot kernel", ErrBad, src)
		}
		if len(head) >= 60 && string(head[56:60]) == "ARM\x64" {
			return nil
		}
		return fmt.Errorf("%w: %s is not an arm64 Image", ErrBad, src)
	}
	return fmt.Errorf("%w: unknown architecture %q", ErrBad, arch)
}

// An EFI zboot kernel (arm64 distributions' vmlinuz, Alpine's linux-virt
// among them) is a PE program that decompresses the real kernel. vz boots
// only the raw Image, so it is unwrapped. Its header: "MZ" at 0, "zimg" at
// 4, the payload's offset (u32 little-endian) at 8 and size at 12, and the
// compression's name, NUL-terminated, at 24.
const zbootHeaderLen = 64

// maxZbootPayload bounds what is read from a zboot file.
const maxZbootPayload = 256 << 20

func isZboot(head []byte) bool {
	return len(head) >= zbootHeaderLen && string(head[0:2]) == "MZ" && string(head[4:8]) == "zimg"
}

// zbootPayload returns a reader of the compressed kernel inside the zboot
// file f whose first bytes are head. Only gzip payloads are accepted.
func zbootPayload(f *os.File, head []byte, src string) (io.Reader, error) {
	off := int64(binary.LittleEndian.Uint32(head[8:12]))
	size := int64(binary.LittleEndian.Uint32(head[12:16]))
	comp, _, _ := bytes.Cut(head[24:zbootHeaderLen], []byte{0})
	if string(comp) != "gzip" {
		return nil, fmt.Errorf("%w: %s is an EFI zboot kernel compressed with %s; vibedom unwraps only gzip", ErrBad, src, strconv.QuoteToASCII(string(comp)))
	}
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if off < zbootHeaderLen || size <= 0 || size > maxZbootPayload || off+size > fi.Size() {
		return nil, fmt.Errorf("%w: %s: zboot payload at %d, %d bytes, does not fit in the file's %d bytes", ErrBad, src, off, size, fi.Size())
	}
	return io.NewSectionReader(f, off, size), nil
}

// CheckELF checks that the program at path is an ELF executable for arch.
func CheckELF(path string, arch vm.Arch) error {
	f, err := elf.Open(path)
	if err != nil {
		return fmt.Errorf("%s is not an ELF program: %w", path, err)
	}
	defer f.Close()
	if want := elfMachine[arch]; f.Machine != want {
		return fmt.Errorf("%s is built for %v, the image is %s", path, f.Machine, arch)
	}
	return nil
}
