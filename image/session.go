package image

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/vibedom/vibedom/guest/proto"
	"github.com/vibedom/vibedom/image/initramfs"
)

// SessionFiles returns a session's boot data files: proto.BootConfigPath
// (cfg as JSON, 0644), proto.HostKeyPath (the guest's SSH host private
// key, 0600) and, when caPEM is not empty, proto.CACertPath (0644). cfg is
// validated first.
func SessionFiles(cfg *proto.BootConfig, hostKeyPEM, caPEM []byte) ([]initramfs.File, error) {
	if cfg == nil {
		return nil, fmt.Errorf("session files: no boot config")
	}
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("session files: boot config: %w", err)
	}
	if !bytes.HasPrefix(bytes.TrimSpace(hostKeyPEM), []byte("-----BEGIN ")) {
		return nil, fmt.Errorf("session files: the guest host key is not a PEM block")
	}
	data, err := cfg.Marshal()
	if err != nil {
		return nil, fmt.Errorf("session files: encode boot config: %w", err)
	}
	files := []initramfs.File{
		{Path: proto.BootConfigPath, Mode: 0o644, Data: append(data, '\n')},
		{Path: proto.HostKeyPath, Mode: 0o600, Data: bytes.Clone(hostKeyPEM)},
	}
	if len(bytes.TrimSpace(caPEM)) > 0 {
		if !bytes.HasPrefix(bytes.TrimSpace(caPEM), []byte("-----BEGIN CERTIFICATE-----")) {
			return nil, fmt.Errorf("session files: the CA certificate is not a PEM certificate")
		}
		files = append(files, initramfs.File{Path: proto.CACertPath, Mode: 0o644, Data: bytes.Clone(caPEM)})
	}
	return files, nil
}

// WriteSessionInitrd writes the initrd of one session to dst: the base
// image's initramfs followed by the archive of files (see initramfs.SessionArchive).
// The kernel unpacks both in order. dst is created 0600, since it holds
// the guest's host key; it is written beside dst and renamed into place, so
// dst is complete or absent. The base is reflinked where the filesystem can
// (FICLONE on Linux, clonefile on macOS), else copied (in the kernel with
// copy_file_range on Linux). dst is not fsynced: it is rebuilt for every
// boot.
func WriteSessionInitrd(dst string, base *Image, files []initramfs.File) error {
	if base == nil || base.Initrd == "" {
		return fmt.Errorf("write session initrd: no base image")
	}
	extra, err := initramfs.SessionArchive(files)
	if err != nil {
		return fmt.Errorf("write session initrd: %w", err)
	}
	var rnd [6]byte
	rand.Read(rnd[:])
	tmp := filepath.Join(filepath.Dir(dst), "."+filepath.Base(dst)+".tmp-"+hex.EncodeToString(rnd[:]))
	f, err := copyBase(tmp, base)
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("write session initrd %s: %w", dst, err)
	}
	_, werr := f.Write(extra)
	cerr := f.Close()
	if err := errors.Join(werr, cerr); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("write session initrd %s: %w", dst, err)
	}
	if err := os.Rename(tmp, dst); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("write session initrd %s: %w", dst, err)
	}
	return nil
}

// copyBase creates path (0600) holding the base initramfs and returns it
// open for writing at its end. The base must be as long as the image
// recorded: a base that shrank or grew since Ensure verified it is refused.
func copyBase(p string, base *Image) (*os.File, error) {
	if f, err := cloneFile(p, base.Initrd, 0o600); err == nil {
		if n, err := f.Seek(0, io.SeekCurrent); err != nil || (base.InitrdSize > 0 && n != base.InitrdSize) {
			f.Close()
			return nil, fmt.Errorf("%w: base initramfs %s changed size", ErrCorrupt, base.Initrd)
		}
		return f, nil
	}
	src, err := os.Open(base.Initrd)
	if err != nil {
		return nil, err
	}
	defer src.Close()
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, err
	}
	// *os.File to *os.File: io.Copy uses copy_file_range where it can.
	n, err := io.Copy(f, src)
	if err == nil && base.InitrdSize > 0 && n != base.InitrdSize {
		err = fmt.Errorf("%w: base initramfs %s changed size", ErrCorrupt, base.Initrd)
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}
