package guest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"time"

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
//
// First it kills every other process of the guest but the control plane
// (stopOthers): the agent, `vibedom exec` commands, their children and
// background writers. The session is over by then, and a file still being
// written would otherwise differ between the change set and the content
// sent, failing the whole collection.
//
// While it scans, before the stream's first byte, it writes a heartbeat
// (a NUL byte every heartbeatEvery) to heartbeat, so the host can tell a
// long scan from a stuck guest; nil writes none.
func WriteCollection(w, heartbeat io.Writer, maxFile int64) error {
	stopOthers()
	bases, err := readBases(basesFile)
	if err != nil {
		return err
	}
	return writeCollection(w, heartbeat, proto.WorkspaceMount, proto.UpperDir, bases, maxFile)
}

// heartbeatEvery is how often WriteCollection shows it is alive while it
// scans.
const heartbeatEvery = 2 * time.Second

func writeCollection(w, heartbeat io.Writer, lower, upper string, bases map[string]overlay.Base, maxFile int64) error {
	stop := make(chan struct{})
	if heartbeat != nil {
		go func() {
			t := time.NewTicker(heartbeatEvery)
			defer t.Stop()
			for {
				select {
				case <-stop:
					return
				case <-t.C:
					_, _ = heartbeat.Write([]byte{0})
				}
			}
		}()
	}
	cs, err := overlay.ScanChangesFrom(lower, upper, bases)
	close(stop)
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
