package guest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"

	"github.com/vibedom/vibedom/guest/proto"
	"github.com/vibedom/vibedom/overlay"
)

// WriteChanges writes the overlay's change set (what the agent changed in
// /work against the read-only workspace) to w as one JSON document, with
// the base of each modified file the guest recorded at copy-up (see
// recordBases). The host runs it as proto.ChangesCommand and trusts none of
// it: the patch is built and checked host-side.
func WriteChanges(w io.Writer) error {
	bases, err := readBases(basesFile)
	if err != nil {
		return err
	}
	cs, err := overlay.ScanChangesFrom(proto.WorkspaceMount, proto.UpperDir, bases)
	if err != nil {
		return err
	}
	return json.NewEncoder(w).Encode(cs)
}

// WriteCollection writes the collection stream (proto.CollectMagic) to w:
// the overlay's change set, with the base of each modified file the guest
// recorded at copy-up (see recordBases), then the content of every added or
// modified regular file of at most maxFile bytes, read from the upper dir.
// The host runs it as proto.CollectCommand and trusts none of it.
func WriteCollection(w io.Writer, maxFile int64) error {
	bases, err := readBases(basesFile)
	if err != nil {
		return err
	}
	return writeCollection(w, proto.WorkspaceMount, proto.UpperDir, bases, maxFile)
}

func writeCollection(w io.Writer, lower, upper string, bases map[string]overlay.Base, maxFile int64) error {
	cs, err := overlay.ScanChangesFrom(lower, upper, bases)
	if err != nil {
		return err
	}
	data, err := json.Marshal(cs)
	if err != nil {
		return err
	}
	cw, err := proto.NewCollectWriter(w)
	if err != nil {
		return err
	}
	if err := cw.Frame(proto.FrameChangeSet, "", int64(len(data)), bytes.NewReader(data)); err != nil {
		return err
	}
	var files int64
	for _, c := range cs.Changes { // sorted by path: the order the stream needs
		if c.Type != overlay.TypeFile || (c.Op != overlay.OpAdd && c.Op != overlay.OpModify) || c.Size > maxFile {
			continue
		}
		if err := sendFile(cw, filepath.Join(upper, filepath.FromSlash(c.Path)), c); err != nil {
			return err
		}
		files++
	}
	if err := cw.End(files); err != nil {
		return err
	}
	return cw.Flush()
}

func sendFile(cw *proto.CollectWriter, name string, c overlay.Change) error {
	// Not through a symlink put in the file's place since the scan.
	f, err := os.OpenFile(name, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return fmt.Errorf("send %s: %w", overlay.DisplayPath(c.Path), err)
	}
	defer f.Close()
	if err := cw.Frame(proto.FrameFile, c.Path, c.Size, f); err != nil {
		return fmt.Errorf("send %s: %w", overlay.DisplayPath(c.Path), err)
	}
	return nil
}
