package overlay

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
)

// Git file modes as they appear in patches.
const (
	ModeFile    uint32 = 0o100644
	ModeExec    uint32 = 0o100755
	ModeSymlink uint32 = 0o120000
)

// gitMode maps a type and permission bits to the mode git records: only a
// file's owner-executable bit survives.
func gitMode(t FileType, perm uint32) uint32 {
	switch t {
	case TypeSymlink:
		return ModeSymlink
	case TypeFile:
		if perm&0o100 != 0 {
			return ModeExec
		}
		return ModeFile
	}
	return 0
}

// Source gives the host the agent's version of changed files (the guest's
// /work), e.g. from the collection stream. Paths are slash-separated and
// relative to the overlay root; they have passed ValidatePath. BuildPatch
// opens each path at most once, in the change set's sorted order, and
// reads it before opening the next, so a Source may read one stream
// forward. The content is untrusted: the patch builder checks its size and
// SHA-256 against the change set as it reads.
type Source interface {
	Open(path string) (io.ReadCloser, error)
}

// OldTree is the workspace as the agent first saw it: the baseline.
type OldTree interface {
	// Old describes path at session start. A path that did not exist has
	// Type "". When the start state cannot be recovered, Old returns the
	// host's current entry with Unknown set.
	Old(path string) (OldEntry, error)
}

// oldSizer is an OldTree that tells a file's size at session start
// without reading it (Baseline.OldSize).
type oldSizer interface {
	OldSize(path string) (int64, bool)
}

// OldEntry is one path of an OldTree.
type OldEntry struct {
	Type    FileType // "" when absent
	Mode    uint32   // permission bits
	Target  string   // symlinks
	Content []byte   // regular files
	// Unknown means the session-start state is not recoverable (manifest
	// baseline, file changed on the host since): the other fields are the
	// host's current entry, and applying over it needs the user's say.
	Unknown bool
	// UnknownWhy says, for the user, why the start state is not known.
	UnknownWhy string
}

// CurrentTree is an OldTree that can also read the workspace as it is now.
// BuildPatch uses it to check the base a change set names for a file (see
// Change.BaseSHA256): without it, a base other than the baseline's is
// treated as unknown.
type CurrentTree interface {
	// Current describes path on the host now; Type "" when absent.
	Current(path string) (OldEntry, error)
}

// ErrContentMismatch means content fetched from the guest did not match the
// size or hash the change set announced.
var ErrContentMismatch = errors.New("content does not match the change set")

// PatchInfoVersion is the version of the PatchInfo JSON (changes.json).
const PatchInfoVersion = 1

// PatchInfo describes a patch the host built: one entry per file diff, in
// patch order, and what the change set held that a git patch cannot carry.
// It is kept beside the patch as changes.json.
type PatchInfo struct {
	Version    int          `json:"version"`
	Files      []PatchFile  `json:"files"`
	NotCarried []NotCarried `json:"not_carried,omitempty"`
}

// PatchFile is one file diff of a patch.
type PatchFile struct {
	Path    string `json:"path"`
	Op      Op     `json:"op"` // add, modify or delete
	OldMode uint32 `json:"old_mode,omitempty"`
	NewMode uint32 `json:"new_mode,omitempty"`
	OldID   string `json:"old_id,omitempty"`
	NewID   string `json:"new_id,omitempty"`
	Binary  bool   `json:"binary,omitempty"`
	Added   int    `json:"added,omitempty"`
	Deleted int    `json:"deleted,omitempty"`
	// BaseUnknown means the old side is the host's current content because
	// the version the agent's copy started from is not known to the host
	// (the session-start content was not recoverable, or the host file
	// changed during the session and the guest named no base it holds):
	// applying it needs the user's decision.
	BaseUnknown bool `json:"base_unknown,omitempty"`
	// BaseWhy says why the base is unknown, for the user.
	BaseWhy string `json:"base_why,omitempty"`
}

// NotCarried is a change the patch does not carry, and why.
type NotCarried struct {
	Path   string `json:"path"`
	Reason string `json:"reason"`
}

// BuildOptions tunes BuildPatch.
type BuildOptions struct {
	// ObjectDir, when set, keeps every old side of the patch by blob id so
	// apply can merge after the host files moved on.
	ObjectDir string
	// MaxFileSize is the largest file carried (default 256 MiB).
	MaxFileSize int64
	// Logger gets debug lines; nil is silent.
	Logger *slog.Logger
}

// BuildPatch turns a validated change set into a git-style patch from the
// old tree (the baseline) to the agent's content, written to w. It returns
// what the patch holds. The patch applies with `git apply` and, for text,
// with `patch -p1`.
//
// The phases are those of a patchBuilder: group the change set by path,
// decide each path's old and new side (reading the agent's content from
// src, in the change set's order), then write the file diffs, deletions
// first. Nothing but w and opts.ObjectDir is written.
func BuildPatch(ctx context.Context, cs *ChangeSet, src Source, old OldTree, w io.Writer, opts BuildOptions) (*PatchInfo, error) {
	if opts.MaxFileSize <= 0 {
		opts.MaxFileSize = 256 << 20
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if err := cs.Validate(); err != nil {
		return nil, err
	}
	b := &patchBuilder{src: src, old: old, opts: opts, log: log,
		objects: &objectStore{dir: opts.ObjectDir}, info: &PatchInfo{Version: PatchInfoVersion},
		states: map[string]*newState{}, hasCarriedBelow: map[string]bool{}}
	defer b.objects.close()
	b.group(cs)
	if err := b.decideAll(ctx); err != nil {
		return nil, err
	}
	if err := b.write(w); err != nil {
		return nil, err
	}
	if err := b.objects.close(); err != nil {
		return nil, err
	}
	return b.info, nil
}

// patchBuilder is one BuildPatch: the change set grouped by path, the file
// diffs decided, and what the patch does not carry.
type patchBuilder struct {
	src     Source
	old     OldTree
	opts    BuildOptions
	log     *slog.Logger
	objects *objectStore
	info    *PatchInfo
	states  map[string]*newState
	order   []string // the paths of states, in the change set's order
	// dels and rest are the file diffs: deletions (written first), then
	// additions and modifications.
	dels, rest []patchEntry
	held       int64 // bytes of fetched new content kept for the writing pass
	// hasCarriedBelow holds the ancestors of every path carried;
	// addedDirs the directories the agent made.
	hasCarriedBelow map[string]bool
	addedDirs       []string
}

// newState is what the change set says of one path.
type newState struct {
	c   *Change // add/modify entry, nil when the path is gone
	del bool
}

// patchEntry is one file diff to write.
type patchEntry struct {
	path    string
	oldT    FileType
	oldMode uint32
	oldData []byte
	newT    FileType
	newMode uint32
	newData []byte
	// refetch: the new content was dropped to bound memory and is
	// read again from src (verified again) when its entry is written.
	refetch  *Change
	unknown  bool
	why      string
	isDelete bool
}

// agentSide is the new side of a path: the agent's type, mode and
// content, and the change it was fetched for (nil when not fetched).
type agentSide struct {
	t       FileType
	perm    uint32
	data    []byte
	fetched *Change
}

// group records each path's last add or modify and whether it was
// deleted, and the skipped entries as not carried.
func (b *patchBuilder) group(cs *ChangeSet) {
	for i := range cs.Changes {
		c := &cs.Changes[i]
		if c.Op == OpSkip {
			b.info.NotCarried = append(b.info.NotCarried, NotCarried{c.Path, c.Reason})
			continue
		}
		st := b.states[c.Path]
		if st == nil {
			st = &newState{}
			b.states[c.Path] = st
			b.order = append(b.order, c.Path)
		}
		if c.Op == OpDelete {
			st.del = true
		} else {
			st.c = c
		}
	}
}

// decideAll decides every path in order, then reports the empty
// directories the agent made and sorts what is not carried.
func (b *patchBuilder) decideAll(ctx context.Context) error {
	for _, p := range b.order {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := b.decide(p, b.states[p]); err != nil {
			return err
		}
	}
	for _, d := range b.addedDirs {
		if !b.hasCarriedBelow[d] {
			b.info.NotCarried = append(b.info.NotCarried, NotCarried{d, "empty directory (git carries files only)"})
		}
	}
	slices.SortFunc(b.info.NotCarried, func(a, b NotCarried) int { return strings.Compare(a.Path, b.Path) })
	return nil
}

// decide finds p's old side (the baseline, or the base the agent's copy
// started from: see resolveBase) and its new side, and adds the file diffs
// between them, or what is not carried.
func (b *patchBuilder) decide(p string, st *newState) error {
	// An old side larger than a file the patch carries is not read: a
	// sparse file of many GiB the agent deleted would fill the host's
	// memory.
	if sz, ok := b.old.(oldSizer); ok {
		if n, ok := sz.OldSize(p); ok && n > b.opts.MaxFileSize {
			b.info.NotCarried = append(b.info.NotCarried, NotCarried{p, fmt.Sprintf("file of %d bytes on the host is larger than the %d carried: change or delete it yourself", n, b.opts.MaxFileSize)})
			return nil
		}
	}
	oe, err := b.old.Old(p)
	if err != nil {
		return fmt.Errorf("read baseline of %s: %w", DisplayPath(p), err)
	}
	if c := st.c; c != nil && !st.del && c.Op == OpModify && c.Type == TypeFile {
		var same bool
		if oe, same, err = resolveBase(b.old, p, c, oe); err != nil {
			return err
		}
		if same {
			return nil // copied up, but the agent changed nothing
		}
	}
	ns, ok, err := b.agentSide(p, st.c, oe)
	if err != nil || !ok {
		return err
	}
	if oe.Type == TypeSpecial {
		b.info.NotCarried = append(b.info.NotCarried, NotCarried{p, "special file on the host is left alone"})
		return nil
	}
	b.addEntries(p, oe, ns)
	return nil
}

// agentSide is p's new side from c (none when c is nil), fetching a file's
// content from src unless the old side holds it. ok is false when the path
// is not carried (a file larger than opts.MaxFileSize).
func (b *patchBuilder) agentSide(p string, c *Change, oe OldEntry) (ns agentSide, ok bool, err error) {
	if c == nil {
		return ns, true, nil
	}
	ns.t, ns.perm = c.Type, c.Mode
	if why := specialBitsLost(c, oe); why != "" {
		b.info.NotCarried = append(b.info.NotCarried, NotCarried{p, why})
	}
	switch c.Type {
	case TypeDir:
		if c.Op == OpAdd && oe.Type != TypeDir {
			b.addedDirs = append(b.addedDirs, p)
		} else if oe.Type == TypeDir && c.Mode != oe.Mode {
			b.info.NotCarried = append(b.info.NotCarried, NotCarried{p, fmt.Sprintf("directory mode %04o (git records no directory modes)", c.Mode)})
		}
	case TypeSymlink:
		ns.data = []byte(c.Target)
	case TypeFile:
		if c.Size > b.opts.MaxFileSize {
			b.info.NotCarried = append(b.info.NotCarried, NotCarried{p, fmt.Sprintf("file of %d bytes is larger than the %d carried", c.Size, b.opts.MaxFileSize)})
			return ns, false, nil
		}
		if oe.Type == TypeFile && int64(len(oe.Content)) == c.Size && sha256hex(oe.Content) == c.SHA256 {
			ns.data = oe.Content
		} else if ns.data, err = fetch(b.src, c); err != nil {
			return ns, false, err
		} else {
			ns.fetched = c
		}
	}
	return ns, true, nil
}

// addEntries adds the file diffs from oe to ns: one modification when both
// sides are files or both symlinks and differ, else a deletion of the old
// side and an addition of the new (each when it is a file or symlink).
func (b *patchBuilder) addEntries(p string, oe OldEntry, ns agentSide) {
	oldT := oe.Type
	oldDiffable := oldT == TypeFile || oldT == TypeSymlink
	newDiffable := ns.t == TypeFile || ns.t == TypeSymlink
	var odata []byte
	if oldT == TypeSymlink {
		odata = []byte(oe.Target)
	} else {
		odata = oe.Content
	}
	om, nm := gitMode(oldT, oe.Mode), gitMode(ns.t, ns.perm)
	if oldDiffable && newDiffable && oldT == ns.t {
		if om == nm && bytes.Equal(odata, ns.data) {
			if ns.t == TypeFile && ns.perm&0o777 != oe.Mode&0o777 {
				b.info.NotCarried = append(b.info.NotCarried, NotCarried{p, fmt.Sprintf("permission change %04o → %04o (git records only the executable bit)", oe.Mode&0o7777, ns.perm)})
			}
			return
		}
		e := patchEntry{path: p, oldT: oldT, oldMode: om, oldData: odata, newT: ns.t, newMode: nm, newData: ns.data, unknown: oe.Unknown, why: oe.UnknownWhy}
		keepBounded(&e.newData, &e.refetch, ns.fetched, &b.held)
		b.rest = append(b.rest, e)
		markCarried(b.hasCarriedBelow, p)
		return
	}
	if oldDiffable {
		b.dels = append(b.dels, patchEntry{path: p, oldT: oldT, oldMode: om, oldData: odata, unknown: oe.Unknown, why: oe.UnknownWhy, isDelete: true})
	}
	if newDiffable {
		e := patchEntry{path: p, newT: ns.t, newMode: nm, newData: ns.data, unknown: oe.Unknown && !oldDiffable, why: oe.UnknownWhy}
		keepBounded(&e.newData, &e.refetch, ns.fetched, &b.held)
		b.rest = append(b.rest, e)
		markCarried(b.hasCarriedBelow, p)
	}
}

// write writes every file diff to w, deletions first, keeping each old
// side of a file in the object store.
func (b *patchBuilder) write(w io.Writer) error {
	var buf bytes.Buffer
	for _, e := range append(b.dels, b.rest...) {
		buf.Reset()
		pf, err := b.writeEntry(&buf, e)
		if err != nil {
			return err
		}
		if _, err := w.Write(buf.Bytes()); err != nil {
			return fmt.Errorf("write patch: %w", err)
		}
		b.info.Files = append(b.info.Files, pf)
		b.log.Debug("patch entry", "path", DisplayPath(pf.Path), "op", pf.Op, "added", pf.Added, "deleted", pf.Deleted, "binary", pf.Binary)
	}
	return nil
}

// writeEntry writes one file diff to buf (reading a dropped new side from
// src again) and returns its description.
func (b *patchBuilder) writeEntry(buf *bytes.Buffer, e patchEntry) (PatchFile, error) {
	if e.refetch != nil {
		var err error
		if e.newData, err = fetch(b.src, e.refetch); err != nil {
			return PatchFile{}, err
		}
	}
	pf := PatchFile{Path: e.path, OldMode: e.oldMode, NewMode: e.newMode, BaseUnknown: e.unknown}
	if e.unknown {
		pf.BaseWhy = e.why
	}
	switch {
	case e.isDelete:
		pf.Op = OpDelete
	case e.oldMode == 0:
		pf.Op = OpAdd
	default:
		pf.Op = OpModify
	}
	if e.oldMode != 0 {
		pf.OldID = blobID(e.oldData)
		if e.oldT == TypeFile && !e.unknown {
			if _, err := b.objects.put(e.oldData); b.opts.ObjectDir != "" && err != nil {
				return PatchFile{}, err
			}
		}
	}
	if e.newMode != 0 {
		pf.NewID = blobID(e.newData)
	}
	pf.Added, pf.Deleted, pf.Binary = writeFileDiff(buf, &pf, e.oldData, e.newData)
	return pf, nil
}

// resolveBase picks the old side of a regular file the agent modified: the
// version the agent's copy started from (c.BaseSHA256), which may already
// hold edits the user made on the host during the session. That version is
// used only when the host holds it itself, by hash: the session-start
// baseline oe or the host's current file. Otherwise, and when the guest
// named no base while the host file changed during the session, the old
// side is the host's current file marked Unknown: applying it is a
// conflict, never a merge that could apply the user's edit twice; but an
// agent's content equal to the session-start content is no change at all,
// base or not (a copy-up by touch or chmod). same reports a copy-up the agent did not change (content and mode equal to its
// base): not a change at all.
func resolveBase(old OldTree, p string, c *Change, oe OldEntry) (res OldEntry, same bool, err error) {
	if c.BaseSHA256 != "" && c.BaseSHA256 == c.SHA256 && c.BaseMode == c.Mode {
		return oe, true, nil
	}
	if c.BaseSHA256 != "" && !oe.Unknown && oe.Type == TypeFile && sha256hex(oe.Content) == c.BaseSHA256 {
		oe.Mode = c.BaseMode
		return oe, false, nil
	}
	if c.BaseSHA256 == "" && !oe.Unknown && oe.Type == TypeFile && sha256hex(oe.Content) == c.SHA256 {
		// No recorded base (touch, chmod, chown copy a file up without
		// opening it) and the agent's content is the session-start
		// content: the content is no change of the agent's, whatever the
		// user did to the host file since. A mode change is carried alone.
		return oe, false, nil
	}
	if c.BaseSHA256 == "" && (oe.Unknown || oe.Type != TypeFile) {
		return oe, false, nil // already unknown, or a type change: decided as before
	}
	ct, ok := old.(CurrentTree)
	if !ok {
		if c.BaseSHA256 == "" {
			return oe, false, nil
		}
		oe.Unknown, oe.UnknownWhy = true, whyBaseNotHeld
		return oe, false, nil
	}
	cur, err := ct.Current(p)
	if err != nil {
		return oe, false, fmt.Errorf("read the workspace's %s: %w", DisplayPath(p), err)
	}
	switch {
	case c.BaseSHA256 == "" && cur.Type == TypeFile && bytes.Equal(cur.Content, oe.Content):
		return oe, false, nil // the host file is as the session started
	case c.BaseSHA256 != "" && cur.Type == TypeFile && sha256hex(cur.Content) == c.BaseSHA256:
		cur.Mode = c.BaseMode
		return cur, false, nil
	}
	cur.Unknown, cur.UnknownWhy = true, whyBaseNotHeld
	if c.BaseSHA256 == "" {
		cur.UnknownWhy = whyNoBase
	}
	return cur, false, nil
}

// Why a base is unknown, as the review says it.
const (
	whyNoBase = "you changed it during the session, and the agent's copy was made without a recorded read " +
		"(chmod, truncate or rename copy a file without opening it): which of your versions it holds is unknown, " +
		"so taking the agent's may undo your edits"
	whyBaseNotHeld = "the guest says the agent started from a version that is neither the session-start file nor yours now " +
		"(you edited it again after the agent read it, or the guest is lying): taking the agent's replaces your file"
	whyStartLost = "you changed it during the session and its session-start content was not kept " +
		"(no copy-on-write baseline here, and it was not clean in git): taking the agent's may undo your edits"
)

// specialBitsLost says what a patch loses of c's setuid, setgid and sticky
// bits (git records none), or "" when the old entry had the same ones. A
// directory whose mode changed is reported with its whole mode elsewhere.
func specialBitsLost(c *Change, oe OldEntry) string {
	if c.Type != TypeFile && c.Type != TypeDir {
		return ""
	}
	var old uint32
	if oe.Type == c.Type {
		if c.Type == TypeDir && c.Mode != oe.Mode {
			return ""
		}
		old = oe.Mode & 0o7000
	}
	if c.Mode&0o7000 == old {
		return ""
	}
	var bits []string
	for _, b := range []struct {
		bit  uint32
		name string
	}{{0o4000, "setuid"}, {0o2000, "setgid"}, {0o1000, "sticky"}} {
		if (c.Mode^old)&b.bit != 0 {
			bits = append(bits, b.name)
		}
	}
	mode := fmt.Sprintf("mode %04o", c.Mode)
	if oe.Type == c.Type {
		mode += fmt.Sprintf(", was %04o", oe.Mode&0o7777)
	}
	return fmt.Sprintf("%s bit (%s) is not carried (git records only the executable bit)", strings.Join(bits, "/"), mode)
}

func markCarried(m map[string]bool, p string) {
	for a := parentDir(p); a != "" && !m[a]; a = parentDir(a) {
		m[a] = true
	}
}

func sha256hex(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// fetch reads a file's content from the guest and checks it against the
// change set's size and hash.
func fetch(src Source, c *Change) ([]byte, error) {
	rc, err := src.Open(c.Path)
	if err != nil {
		return nil, fmt.Errorf("fetch %s from the guest: %w", DisplayPath(c.Path), err)
	}
	defer rc.Close()
	data, err := io.ReadAll(io.LimitReader(rc, c.Size+1))
	if err != nil {
		return nil, fmt.Errorf("fetch %s from the guest: %w", DisplayPath(c.Path), err)
	}
	if int64(len(data)) != c.Size || sha256hex(data) != c.SHA256 {
		return nil, fmt.Errorf("fetch %s from the guest: %w (%d bytes, sha256 %s; listed %d bytes, %s): the file changed after the scan; stop the agent and list the changes again",
			DisplayPath(c.Path), ErrContentMismatch, len(data), sha256hex(data)[:12], c.Size, c.SHA256[:12])
	}
	return data, nil
}

// writeFileDiff writes one "diff --git" entry. A zero mode is an absent side.
func writeFileDiff(w *bytes.Buffer, pf *PatchFile, old, new []byte) (added, deleted int, binary bool) {
	p := pf.Path
	// Git leaves spaces unquoted, but GNU patch cannot split such a header
	// when no ---/+++ lines follow (mode changes): quote them here.
	a, b := gitQuoteSpace("a/", p), gitQuoteSpace("b/", p)
	fmt.Fprintf(w, "diff --git %s %s\n", a, b)
	switch {
	case pf.OldMode == 0:
		fmt.Fprintf(w, "new file mode %06o\n", pf.NewMode)
	case pf.NewMode == 0:
		fmt.Fprintf(w, "deleted file mode %06o\n", pf.OldMode)
	case pf.OldMode != pf.NewMode:
		fmt.Fprintf(w, "old mode %06o\nnew mode %06o\n", pf.OldMode, pf.NewMode)
	}
	oldID, newID := pf.OldID, pf.NewID
	if oldID == "" {
		oldID = zeroID
	}
	if newID == "" {
		newID = zeroID
	}
	if oldID == newID {
		return 0, 0, false // mode change only
	}
	if pf.OldMode != 0 && pf.NewMode != 0 && pf.OldMode == pf.NewMode {
		fmt.Fprintf(w, "index %s..%s %06o\n", oldID, newID, pf.OldMode)
	} else {
		fmt.Fprintf(w, "index %s..%s\n", oldID, newID)
	}
	if len(old) == 0 && len(new) == 0 {
		return 0, 0, false // empty file created or deleted
	}
	from, to := "/dev/null", "/dev/null"
	if pf.OldMode != 0 {
		from = headerName("a/", p)
	}
	if pf.NewMode != 0 {
		to = headerName("b/", p)
	}
	if isBinary(old) || isBinary(new) || tooManyLines(old, new) {
		w.WriteString("GIT binary patch\n")
		writeBinaryLiteral(w, new)
		writeBinaryLiteral(w, old)
		return 0, 0, true
	}
	fmt.Fprintf(w, "--- %s\n+++ %s\n", from, to)
	added, deleted = writeHunks(w, lineDiff(string(old), string(new)))
	return added, deleted, false
}

// headerName is a ---/+++ name: git quotes it when needed, and ends an
// unquoted name holding a space with a tab so `patch` knows where it ends.
func headerName(prefix, p string) string {
	q := gitQuote(prefix, p)
	if q[0] != '"' && strings.ContainsRune(q, ' ') {
		return q + "\t"
	}
	return q
}

// maxHeldContent bounds the fetched new content the patch builder keeps
// between reading the change set and writing the patch: past it, content
// is dropped and read again (and verified again) when written, so a guest
// that lists one big file under a thousand names (hard links: little of its
// disk) costs the host one file's worth at a time, not all of them.
const maxHeldContent = 128 << 20

func keepBounded(data *[]byte, refetch **Change, fetched *Change, held *int64) {
	if fetched == nil {
		return
	}
	if *held+int64(len(*data)) <= maxHeldContent {
		*held += int64(len(*data))
		return
	}
	*data, *refetch = nil, fetched
}
