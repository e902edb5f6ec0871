// Package ext4 writes a read-only ext4 filesystem image from a tree held
// in memory, deterministically: the same tree and Options give a
// byte-identical image. It is how vibedom builds the guest's root image on
// any host (no root, no mkfs, works on macOS).
//
// This file is the contract between the writer and its callers (the root
// image builder); the writer itself is in write.go.
package ext4

import (
	"io"
	"io/fs"
	"time"
)

// Type is the kind of a Node.
type Type int

const (
	TypeFile Type = iota
	TypeDir
	TypeSymlink
	TypeCharDev
	TypeBlockDev
	TypeFIFO
	TypeSocket
)

// Meta is what every inode carries.
type Meta struct {
	// Mode holds the permission bits and fs.ModeSetuid, fs.ModeSetgid and
	// fs.ModeSticky; the type bits are ignored (Node.Type decides).
	Mode     fs.FileMode
	UID, GID uint32
	ModTime  time.Time
	// Xattrs are extended attributes ("security.capability", "user.x"),
	// stored in the inode; nil when none.
	Xattrs map[string]string
}

// Node is one inode. A hard link is the same *Node appearing under two
// names (in one or two directories).
type Node struct {
	Type Type
	Meta Meta
	// Size and Open: a regular file's length and its content. Open is
	// called at most once, while Write runs, and must yield exactly Size
	// bytes.
	Size int64
	Open func() (io.ReadCloser, error)
	// Target is a symlink's target, as written.
	Target string
	// Major and Minor are a device node's numbers.
	Major, Minor uint32
	// Entries are a directory's children, in any order (Write sorts them
	// by name); names are single path elements, never "." or "..".
	Entries []Dirent
}

// Dirent names a Node inside a directory.
type Dirent struct {
	Name string
	Node *Node
}

// Options fix everything that would otherwise vary between builds.
type Options struct {
	// Label is the volume label (at most 16 bytes); the guest finds its
	// root image by it.
	Label string
	// UUID is the filesystem UUID; derive it from the content (e.g. the
	// first 16 bytes of the lock's sha256) so builds are reproducible.
	UUID [16]byte
	// Time stamps the superblock (and anything without its own time).
	Time time.Time
	// FreeBlocks and FreeInodes are slack left in the image beyond what
	// the tree needs (the image is mounted read-only, so 0 is fine).
	FreeBlocks, FreeInodes uint64
}

// Stats describe a written image.
type Stats struct {
	Size                   int64 // bytes of the image file
	Blocks, Inodes         uint64
	UsedBlocks, UsedInodes uint64
}
