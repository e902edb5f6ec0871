//go:build unix

package overlay

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"sync"

	"github.com/vibedom/vibedom/atomicfile"
)

// WriteSessionPatch is the end of a session on the host: it builds the patch
// from the session's baseline (sessionDir/baseline) to the agent's content
// (src) for the validated change set, and writes changes.patch,
// changes.json and the old sides under objects/ into sessionDir, so review,
// apply and undo work after the VM is gone. The patch file is replaced
// atomically, and only once a src that is a VerifiedSource verified.
func WriteSessionPatch(ctx context.Context, sessionDir string, cs *ChangeSet, src Source, log *slog.Logger) (*PatchInfo, error) {
	bl, err := OpenBaseline(filepath.Join(sessionDir, BaselineDir))
	if err != nil {
		return nil, fmt.Errorf("build patch: %w", err)
	}
	defer bl.Close()
	return writeSessionPatch(ctx, sessionDir, cs, src, bl, log)
}

func writeSessionPatch(ctx context.Context, sessionDir string, cs *ChangeSet, src Source, old OldTree, log *slog.Logger) (*PatchInfo, error) {
	f, err := atomicfile.New(filepath.Join(sessionDir, PatchFileName), 0o600)
	if err != nil {
		return nil, fmt.Errorf("build patch: %w", err)
	}
	defer f.Abort()
	w := bufio.NewWriterSize(f, 1<<20)
	info, err := BuildPatch(ctx, cs, src, old, w, BuildOptions{ObjectDir: filepath.Join(sessionDir, ObjectsDir), Logger: log})
	if err != nil {
		return nil, err
	}
	if err := w.Flush(); err != nil {
		return nil, fmt.Errorf("write patch: %w", err)
	}
	if v, ok := src.(VerifiedSource); ok {
		if err := v.Verify(); err != nil {
			return nil, err
		}
	}
	data, _ := json.Marshal(info) // not indented: a million entries would be held twice
	if err := atomicfile.WriteFile(filepath.Join(sessionDir, InfoFileName), append(data, '\n'), 0o600); err != nil {
		return nil, fmt.Errorf("write %s: %w", InfoFileName, err)
	}
	if err := f.Commit(); err != nil {
		return nil, fmt.Errorf("write patch: %w", err)
	}
	return info, nil
}

// VerifiedSource is a Source whose content can be trusted only once it
// says so after the builder read everything (a stream whose end is still
// to be checked): WriteSessionPatch puts no patch in place unless Verify
// returns nil.
type VerifiedSource interface {
	Source
	Verify() error
}

// DirSource reads the agent's content from a local directory (a test stand
// in for the guest, or a mounted copy of the guest's /work). It never follows
// symlinks.
func DirSource(dir string) Source { return &dirSource{dir: dir} }

type dirSource struct {
	dir  string
	mu   sync.Mutex
	root *hostRoot
}

func (d *dirSource) Open(p string) (io.ReadCloser, error) {
	if err := ValidatePath(p); err != nil {
		return nil, err
	}
	d.mu.Lock()
	if d.root == nil {
		r, err := openHostRoot(d.dir)
		if err != nil {
			d.mu.Unlock()
			return nil, err
		}
		d.root = r
	}
	root := d.root
	d.mu.Unlock()
	data, err := root.readFile(p)
	if err != nil {
		return nil, err
	}
	return io.NopCloser(bytes.NewReader(data)), nil
}
