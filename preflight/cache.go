package preflight

import (
	"bytes"
	"crypto/sha256"
	"encoding/gob"
	"encoding/hex"
	"errors"
	"fmt"
	"github.com/vibedom/vibedom/atomicfile"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// The cache has two parts, both under Options.CacheDir:
//
//   - clean-<rules digest>.gob: the set of (content, path) pairs known to
//     have no findings under that rule set. The key is
//     sha256(sha256(content) || path): gitleaks rules and allowlists can
//     depend on the path, so a verdict is only reused for the same bytes at
//     the same path. Only "clean" is stored; a file with findings is read
//     and scanned again every time, because the DLP needs its secret values
//     and the cache never holds a secret.
//   - memo-<workspace digest>.gob: per workspace, path → (size, mtime, ctime,
//     inode, device, content sha256), so an unchanged file is neither read
//     nor hashed. A file whose mtime or ctime is within racyWindow of the
//     moment it was read is not memoised (a write in the same timestamp tick
//     would otherwise go unnoticed).
//
// A corrupt or unreadable cache is ignored and rebuilt.

const (
	cacheVersion = 1
	racyWindow   = 2 * time.Second
	// verdictTTL drops clean verdicts not used for this long.
	verdictTTL = 90 * 24 * time.Hour
	// maxVerdicts bounds the verdict file; the least recently used go first.
	maxVerdicts = 2_000_000
)

type statKey struct {
	Size         int64
	Mtime, Ctime int64
	Ino, Dev     uint64
}

type memoEntry struct {
	Stat statKey
	Hash [32]byte
}

type memoFile struct {
	Version   int
	Workspace string
	// Digest is the rule set of the scan that wrote the file: its entries
	// are then also known not to be excluded by a global path allowlist.
	Digest  string
	Entries map[string]memoEntry
}

type verdictFile struct {
	Version int
	Digest  string
	// Clean maps a verdict key to the day (Unix days) it was last used.
	Clean map[[32]byte]int32
}

// cache is one scan's view of the on-disk cache; its methods are safe for
// concurrent use by the workers.
type cache struct {
	dir       string
	digest    string
	workspace string
	today     int32

	// oldMemo is read-only after openCache; sameRules says whether it was
	// written under the current rule set.
	oldMemo   map[string]memoEntry
	sameRules bool

	mu       sync.Mutex
	newMemo  map[string]memoEntry
	clean    map[[32]byte]int32
	addClean map[[32]byte]int32
}

func memoPath(dir, workspace string) string {
	h := sha256.Sum256([]byte(workspace))
	return filepath.Join(dir, "memo-"+hex.EncodeToString(h[:16])+".gob")
}

func verdictPath(dir, digest string) string {
	return filepath.Join(dir, "clean-"+digest[:32]+".gob")
}

// openCache loads the cache for one workspace and rule set. The returned
// warning is non-empty when an existing cache file could not be used.
func openCache(dir, digest, workspace string, now time.Time) (*cache, string) {
	c := &cache{
		dir: dir, digest: digest, workspace: workspace,
		today:    int32(now.Unix() / 86400),
		oldMemo:  map[string]memoEntry{},
		newMemo:  map[string]memoEntry{},
		clean:    map[[32]byte]int32{},
		addClean: map[[32]byte]int32{},
	}
	var warns []error
	var m memoFile
	if err := readGob(memoPath(dir, workspace), &m); err != nil {
		warns = append(warns, err)
	} else if m.Version == cacheVersion && m.Workspace == workspace && m.Entries != nil {
		c.oldMemo = m.Entries
		c.sameRules = m.Digest == digest
	}
	var v verdictFile
	if err := readGob(verdictPath(dir, digest), &v); err != nil {
		warns = append(warns, err)
	} else if v.Version == cacheVersion && v.Digest == digest && v.Clean != nil {
		c.clean = v.Clean
	}
	if err := errors.Join(warns...); err != nil {
		return c, fmt.Sprintf("preflight cache ignored (it will be rebuilt): %v", err)
	}
	return c, ""
}

func readGob(path string, v any) error {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if err := gob.NewDecoder(bytes.NewReader(b)).Decode(v); err != nil {
		return fmt.Errorf("decode %s: %w", path, err)
	}
	return nil
}

// scannedBefore reports whether rel was scanned under the same rules by the
// last scan (so no global allowlist excludes it). Safe without the lock.
func (c *cache) scannedBefore(rel string) bool {
	if !c.sameRules {
		return false
	}
	_, ok := c.oldMemo[rel]
	return ok
}

// lookupHash returns the content hash memoised for rel when st is
// unchanged.
func (c *cache) lookupHash(rel string, st statKey) ([32]byte, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.oldMemo[rel]
	if !ok || e.Stat != st {
		return [32]byte{}, false
	}
	c.newMemo[rel] = e
	return e.Hash, true
}

// remember memoises rel's content hash, unless its timestamps are too close
// to readAt to be trusted, or the file system keeps no ctime (some FUSE and
// network file systems report 0): the ctime is what reveals a rewrite whose
// size and mtime were put back.
func (c *cache) remember(rel string, st statKey, hash [32]byte, readAt time.Time) {
	edge := readAt.Add(-racyWindow).UnixNano()
	if st.Mtime >= edge || st.Ctime >= edge || st.Ctime <= 0 {
		return
	}
	c.mu.Lock()
	c.newMemo[rel] = memoEntry{Stat: st, Hash: hash}
	c.mu.Unlock()
}

func verdictKey(hash [32]byte, rel string) [32]byte {
	h := sha256.New()
	h.Write(hash[:])
	h.Write([]byte(rel))
	var k [32]byte
	h.Sum(k[:0])
	return k
}

// isClean reports whether the pair is known to have no findings.
func (c *cache) isClean(hash [32]byte, rel string) bool {
	k := verdictKey(hash, rel)
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.clean[k]; ok {
		c.addClean[k] = c.today
		return true
	}
	return false
}

func (c *cache) markClean(hash [32]byte, rel string) {
	k := verdictKey(hash, rel)
	c.mu.Lock()
	c.addClean[k] = c.today
	c.mu.Unlock()
}

// save writes both files atomically. The verdict file is shared between
// workspaces, so it is re-read and merged just before writing.
func (c *cache) save() error {
	if err := os.MkdirAll(c.dir, 0o700); err != nil {
		return fmt.Errorf("create preflight cache %s: %w", c.dir, err)
	}
	memo := memoFile{Version: cacheVersion, Workspace: c.workspace, Digest: c.digest, Entries: c.newMemo}
	if !c.sameRules || !sameMemo(c.oldMemo, c.newMemo) {
		if err := writeGob(memoPath(c.dir, c.workspace), memo); err != nil {
			return err
		}
	}

	changed := false
	for k, d := range c.addClean {
		if c.clean[k] != d {
			changed = true
			break
		}
	}
	if !changed {
		return nil
	}
	var disk verdictFile
	merged := map[[32]byte]int32{}
	if err := readGob(verdictPath(c.dir, c.digest), &disk); err == nil && disk.Version == cacheVersion && disk.Digest == c.digest {
		merged = disk.Clean
		if merged == nil {
			merged = map[[32]byte]int32{}
		}
	}
	for k, d := range c.clean {
		if merged[k] < d {
			merged[k] = d
		}
	}
	for k, d := range c.addClean {
		merged[k] = d
	}
	oldest := c.today - int32(verdictTTL/(24*time.Hour))
	for k, d := range merged {
		if d < oldest {
			delete(merged, k)
		}
	}
	for len(merged) > maxVerdicts {
		// Drop the oldest day until the set fits.
		minDay := c.today
		for _, d := range merged {
			minDay = min(minDay, d)
		}
		for k, d := range merged {
			if d == minDay {
				delete(merged, k)
			}
		}
		if minDay == c.today {
			break
		}
	}
	return writeGob(verdictPath(c.dir, c.digest), verdictFile{Version: cacheVersion, Digest: c.digest, Clean: merged})
}

func sameMemo(a, b map[string]memoEntry) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

func writeGob(path string, v any) error {
	var buf bytes.Buffer
	if err := gob.NewEncoder(&buf).Encode(v); err != nil {
		return fmt.Errorf("encode %s: %w", path, err)
	}
	return atomicfile.WriteFile(path, buf.Bytes(), 0o600)
}
