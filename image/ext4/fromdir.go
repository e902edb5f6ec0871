package ext4

import (
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"time"
)

// TreeFromDir mirrors the host directory dir as a tree: directories,
// regular files (opened when Write copies them) and symbolic links (their
// targets as written, never followed). Owners become root; modes and
// modification times are kept. Anything else (devices, sockets) is an
// error naming it. It is for directories vibedom itself made and verified
// (an agent's unpacked package), not for hostile trees.
func TreeFromDir(dir string, modTime time.Time) (*Node, error) {
	root := &Node{Type: TypeDir, Meta: Meta{Mode: 0o755, ModTime: modTime}}
	nodes := map[string]*Node{".": root}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil || rel == "." {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		parent := nodes[filepath.Dir(rel)]
		if parent == nil {
			return fmt.Errorf("%s: parent not seen", p)
		}
		meta := Meta{Mode: fi.Mode() & (fs.ModePerm | fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky), ModTime: fi.ModTime()}
		var n *Node
		switch {
		case fi.IsDir():
			n = &Node{Type: TypeDir, Meta: meta}
			nodes[rel] = n
		case fi.Mode().IsRegular():
			path := p
			n = &Node{Type: TypeFile, Meta: meta, Size: fi.Size(), Open: func() (io.ReadCloser, error) { return os.Open(path) }}
		case fi.Mode()&fs.ModeSymlink != 0:
			t, err := os.Readlink(p)
			if err != nil {
				return err
			}
			n = &Node{Type: TypeSymlink, Target: t, Meta: Meta{Mode: 0o777, ModTime: fi.ModTime()}}
		default:
			return fmt.Errorf("%s: not a file, directory or symbolic link", p)
		}
		parent.Entries = append(parent.Entries, Dirent{Name: d.Name(), Node: n})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("ext4: %w", err)
	}
	return root, nil
}
