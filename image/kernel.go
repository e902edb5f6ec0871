package image

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/vibedom/vibedom/vm"
)

// ErrBadKernel means a kernel file is not a bootable kernel for the
// image's architecture.
var ErrBadKernel = errors.New("not a usable kernel image")

// findKernel finds boot/vmlinuz-<release> in an unpacked kernel package
// and the matching lib/modules/<release> directory.
func findKernel(kernelDir string) (vmlinuz, release string, err error) {
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

// writeKernel copies the kernel at src to dst in the form the hypervisors
// boot: an x86 bzImage as is; an arm64 kernel as an uncompressed Image,
// gunzipping it first if it is gzip-compressed (vz cannot boot a
// compressed arm64 kernel). It checks the result's boot header.
func writeKernel(dst, src string, arch vm.Arch) error {
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
		if err := checkKernelHeader(bz, arch, src); err != nil {
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
	if magic, _ := br.Peek(2); len(magic) == 2 && magic[0] == 0x1f && magic[1] == 0x8b {
		if arch != vm.ArchARM64 {
			return fmt.Errorf("%w: %s is gzip-compressed; only arm64 kernels are unpacked", ErrBadKernel, src)
		}
		gz, err := gzip.NewReader(br)
		if err != nil {
			return fmt.Errorf("%w: %s: %v", ErrBadKernel, src, err)
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
	return checkKernelHeader(head.Bytes(), arch, src)
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

// checkKernelHeader checks the boot header of an (uncompressed) kernel:
// "HdrS" at 0x202 for an x86 bzImage, "ARM\x64" at 56 for an arm64 Image.
func checkKernelHeader(head []byte, arch vm.Arch, src string) error {
	switch arch {
	case vm.ArchAMD64:
		if len(head) >= 0x206 && string(head[0x202:0x206]) == "HdrS" {
			return nil
		}
		return fmt.Errorf("%w: %s is not an x86 bzImage", ErrBadKernel, src)
	case vm.ArchARM64:
		if len(head) >= 8 && string(head[4:8]) == "zimg" {
			return fmt.Errorf("%w: %s is an EFI zboot kernel, which cannot be booted directly; use a kernel packaged as a plain or gzipped Image", ErrBadKernel, src)
		}
		if len(head) >= 60 && string(head[56:60]) == "ARM\x64" {
			return nil
		}
		return fmt.Errorf("%w: %s is not an arm64 Image", ErrBadKernel, src)
	}
	return fmt.Errorf("%w: unknown architecture %q", ErrBadKernel, arch)
}

// checkELF checks that the program at path is an ELF executable for arch.
func checkELF(path string, arch vm.Arch) error {
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

// hexSum returns the hex SHA-256 of s.
func hexSum(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:])
}
