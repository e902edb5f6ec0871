//go:build unix

package overlay

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// Session folder layout used by the overlay package.
const (
	PatchFileName = "changes.patch" // the patch
	InfoFileName  = "changes.json"  // PatchInfo beside it
	ObjectsDir    = "objects"       // old sides by blob id
	BackupsDir    = "backups"       // one folder per apply, for undo
	BaselineDir   = "baseline"      // TakeBaseline's folder
)

// Resolution is the user's answer to a conflict.
type Resolution int

// Resolutions.
const (
	KeepMine   Resolution = iota // leave the host's version alone
	TakeAgent                    // write the agent's version over it
	WriteMarks                   // write both, between conflict markers
)

func (r Resolution) String() string {
	switch r {
	case TakeAgent:
		return "take the agent's"
	case WriteMarks:
		return "conflict markers"
	}
	return "keep mine"
}

// ConflictKind says what the user and the agent both did to a path.
type ConflictKind string

// Conflict kinds.
const (
	BothModified     ConflictKind = "both modified"
	BothAdded        ConflictKind = "both added"
	DeletedByYou     ConflictKind = "you deleted, the agent modified"
	DeletedByAgent   ConflictKind = "the agent deleted, you modified"
	BaseUnknown      ConflictKind = "the version the agent started from is unknown"
	TypeChanged      ConflictKind = "the file type differs"
	ModeConflict     ConflictKind = "both changed the mode"
	UnmergeableWrite ConflictKind = "both modified (binary or symlink)"
)

// Conflict is one path both the user and the agent changed, where no clean
// merge exists. Options lists the resolutions that make sense.
type Conflict struct {
	Path string
	Kind ConflictKind
	// Why says more about the kind, when there is more to say (why the
	// base is unknown; why the path is flagged).
	Why     string
	Options []Resolution
}

// Status is what Plan decided for one path.
type Status string

// Statuses.
const (
	StatusApply     Status = "apply"     // host unchanged since the baseline: applied as is
	StatusMerged    Status = "merged"    // you changed it too; merged cleanly
	StatusAlready   Status = "already"   // the host already has the agent's version
	StatusConflict  Status = "conflict"  // needs a resolution
	StatusProtected Status = "protected" // refused: protected path
	StatusRefused   Status = "refused"   // refused: unsafe or does not fit the workspace
	StatusSkipped   Status = "skipped"   // not selected
)

// PlannedFile is one path of a plan.
type PlannedFile struct {
	Path      string
	Op        Op // add, modify or delete (type changes: modify)
	Status    Status
	Attention Attention
	// Why explains the attention, refusal or conflict.
	Why string
	// AttentionWhy explains the attention alone (Why may have moved on to
	// a conflict or a refusal).
	AttentionWhy string
	Conflict     *Conflict
	Added        int
	Deleted      int
	Binary       bool
	// Entries are the patch entries for the path (two for a type change).
	Entries []*FilePatch

	oldT, newT, curT    FileType
	oldData, newData    []byte
	newGitMode          uint32
	oldGitMode          uint32
	baseKnown, textBase bool
	cur                 hostEntry
	curData             []byte
	merged              []byte
	marks               []byte
}

// Plan is what applying a patch would do, computed without writing.
type Plan struct {
	Workspace  string
	Files      []*PlannedFile
	NotCarried []NotCarried
}

// Count returns how many planned files have status s.
func (p *Plan) Count(s Status) int {
	n := 0
	for _, f := range p.Files {
		if f.Status == s {
			n++
		}
	}
	return n
}

// ApplyOptions says what to apply where.
type ApplyOptions struct {
	// Workspace is the host directory the patch applies to.
	Workspace string
	// SessionDir holds objects/ (old sides), changes.json and backups/.
	SessionDir string
	// Patch is the patch text (untrusted). Empty means SessionDir's
	// changes.patch.
	Patch []byte
	// Files limits the apply to these paths (exact, or a directory prefix
	// ending in "/"); empty means all.
	Files []string
	// ExactFiles makes Files exact paths only: a selection from the review's
	// list, where "lib" (a file the agent turned into a directory) must not
	// bring in everything under lib/.
	ExactFiles bool
	// AllowProtected lists protected paths the user allows (exact, "dir/"
	// prefix or glob).
	AllowProtected []string
	// AllowOutsideSymlinks allows symlinks that resolve outside the workspace
	// or loop (they are still flagged).
	AllowOutsideSymlinks bool
	// Resolve answers conflicts; nil keeps the host's version of each, and
	// the conflict is reported.
	Resolve func(*Conflict) Resolution
	// Logger gets debug lines; nil is silent.
	Logger *slog.Logger
}

func (o *ApplyOptions) log() *slog.Logger {
	if o.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return o.Logger
}

// ReadSessionPatch reads the patch and its PatchInfo (nil when absent) from
// a session folder.
func ReadSessionPatch(sessionDir string) ([]byte, *PatchInfo, error) {
	data, err := os.ReadFile(filepath.Join(sessionDir, PatchFileName))
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil, fmt.Errorf("session %s has no %s: the session did not end normally; recover it first", sessionDir, PatchFileName)
		}
		return nil, nil, fmt.Errorf("read patch: %w", err)
	}
	var info *PatchInfo
	if raw, err := os.ReadFile(filepath.Join(sessionDir, InfoFileName)); err == nil {
		var pi PatchInfo
		if json.Unmarshal(raw, &pi) == nil && pi.Version == PatchInfoVersion {
			info = &pi
		}
	}
	return data, info, nil
}

// selected reports whether p is in the selection.
func selected(p string, files []string) bool {
	if len(files) == 0 {
		return true
	}
	for _, f := range files {
		f = strings.TrimPrefix(f, "./")
		if f == p || (strings.HasSuffix(f, "/") && strings.HasPrefix(p, f)) || strings.HasPrefix(p, f+"/") {
			return true
		}
	}
	return false
}

// MakePlan parses the patch and decides, path by path, what applying it
// would do to the workspace as it is now. It writes nothing.
func MakePlan(ctx context.Context, opts ApplyOptions) (*Plan, error) {
	patch, info := opts.Patch, (*PatchInfo)(nil)
	if len(patch) == 0 {
		var err error
		if patch, info, err = ReadSessionPatch(opts.SessionDir); err != nil {
			return nil, err
		}
	} else if opts.SessionDir != "" {
		_, info, _ = ReadSessionPatch(opts.SessionDir)
	}
	fps, err := ParsePatch(patch)
	if err != nil {
		return nil, err
	}
	root, err := openHostRoot(opts.Workspace)
	if err != nil {
		return nil, err
	}
	defer root.Close()
	pl := &Plan{Workspace: opts.Workspace}
	unknown := map[string]string{} // path, old blob -> why the base is unknown
	if info != nil {
		pl.NotCarried = info.NotCarried
		for _, f := range info.Files {
			if f.BaseUnknown {
				unknown[f.Path+"\x00"+f.OldID] = f.BaseWhy
				if f.BaseWhy == "" {
					unknown[f.Path+"\x00"+f.OldID] = "the session-start content is not known"
				}
			}
		}
	}
	byPath := map[string]*PlannedFile{}
	for _, fp := range fps {
		pf := byPath[fp.Path]
		if pf == nil {
			pf = &PlannedFile{Path: fp.Path}
			byPath[fp.Path] = pf
			pl.Files = append(pl.Files, pf)
		}
		pf.Entries = append(pf.Entries, fp)
		pf.Added += fp.Added
		pf.Deleted += fp.Deleted
		pf.Binary = pf.Binary || fp.Binary
	}
	slices.SortFunc(pl.Files, func(a, b *PlannedFile) int { return strings.Compare(a.Path, b.Path) })
	// Paths that this patch turns into symlinks, and paths it deletes.
	linkAfter := map[string]bool{}
	deleted := map[string]bool{}
	emptied := map[string]bool{} // ancestors of deleted paths
	for _, pf := range pl.Files {
		last := pf.Entries[len(pf.Entries)-1]
		if last.Op != OpDelete && last.NewMode == ModeSymlink {
			linkAfter[pf.Path] = true
		}
		if pf.Entries[0].Op == OpDelete {
			deleted[pf.Path] = true
			for a := parentDir(pf.Path); a != ""; a = parentDir(a) {
				emptied[a] = true
			}
		}
	}
	o := &objectStore{}
	if opts.SessionDir != "" {
		o.dir = filepath.Join(opts.SessionDir, ObjectsDir)
	}
	for _, pf := range pl.Files {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		planOne(ctx, root, o, pf, opts, unknown, linkAfter, deleted, emptied)
	}
	checkFinalTree(root, pl, opts)
	if hooks := gitHooksDir(ctx, opts.Workspace); hooks != "" {
		for _, pf := range pl.Files {
			if pf.Status != StatusApply && pf.Status != StatusMerged && pf.Status != StatusConflict {
				continue
			}
			if fp := foldPath(pf.Path); fp == foldPath(hooks) || strings.HasPrefix(fp, foldPath(hooks)+"/") {
				pf.attend(AttentionProtected, "git runs the hooks in "+DisplayPath(hooks)+"/ (core.hooksPath)")
				if !allowedBy(pf.Path, opts.AllowProtected) {
					refuse(pf, StatusProtected, fmt.Sprintf("protected path: %s; to apply it anyway: --allow-protected %s", pf.Why, pf.Path))
				}
			}
		}
	}
	if progs := gitConfigPrograms(ctx, opts.Workspace); len(progs) > 0 {
		for _, pf := range pl.Files {
			if pf.Status != StatusApply && pf.Status != StatusMerged && pf.Status != StatusConflict {
				continue
			}
			for _, pr := range progs {
				// The file itself, or a directory on its way (a symlink there
				// redirects it).
				if fp, fr := foldPath(pf.Path), foldPath(pr.rel); fp == fr || strings.HasPrefix(fr, fp+"/") || strings.HasPrefix(fp, fr+"/") {
					pf.attend(AttentionProtected, pr.why)
					if !allowedBy(pf.Path, opts.AllowProtected) {
						refuse(pf, StatusProtected, fmt.Sprintf("protected path: %s; to apply it anyway: --allow-protected %s", pf.Why, pf.Path))
					}
					break
				}
			}
		}
	}
	checkCollisions(root, pl)
	return pl, nil
}

// attend sets the path's attention level and why. A conflict keeps its own
// Why (the attention's stays in AttentionWhy and on the conflict).
func (pf *PlannedFile) attend(a Attention, why string) {
	pf.Attention, pf.AttentionWhy = a, why
	if pf.Status == StatusConflict {
		pf.Conflict.Why = joinWhy(pf.Conflict.Why, a.String()+": "+why)
		pf.Why = string(pf.Conflict.Kind) + ": " + pf.Conflict.Why
		return
	}
	pf.Why = why
}

func joinWhy(a, b string) string {
	if a == "" {
		return b
	}
	return a + "; " + b
}

func refuse(pf *PlannedFile, s Status, why string) {
	pf.Status, pf.Why = s, why
}

// planOne decides one path.
func planOne(ctx context.Context, root *hostRoot, objs *objectStore, pf *PlannedFile, opts ApplyOptions, unknown map[string]string, linkAfter, deleted, emptied map[string]bool) {
	first, last := pf.Entries[0], pf.Entries[len(pf.Entries)-1]
	switch {
	case len(pf.Entries) == 2:
		pf.Op = OpModify
	default:
		pf.Op = first.Op
	}
	pf.oldGitMode = first.OldMode
	if first.Op != OpAdd {
		pf.oldT = oldType(first)
	}
	if last.Op != OpDelete {
		pf.newGitMode = last.NewMode
		pf.newT = modeType(last.NewMode)
		if pf.newT == "" {
			pf.newT = TypeFile // a modify that names no mode: a file
		}
	}
	classify := ClassifyPath
	if pf.newT == TypeSymlink {
		classify = ClassifyDir // a symlink named .vscode is what that directory is
	}
	if a, why := classify(pf.Path); a != AttentionNone {
		pf.attend(a, why)
	}
	if opts.ExactFiles && len(opts.Files) > 0 && !slices.Contains(opts.Files, pf.Path) || !selected(pf.Path, opts.Files) {
		refuse(pf, StatusSkipped, "not selected")
		return
	}
	if pf.Attention == AttentionProtected && !allowedBy(pf.Path, opts.AllowProtected) {
		refuse(pf, StatusProtected, fmt.Sprintf("protected path: %s; to apply it anyway: --allow-protected %s", pf.Why, pf.Path))
		return
	}
	for a := parentDir(pf.Path); a != ""; a = parentDir(a) {
		if linkAfter[a] {
			refuse(pf, StatusRefused, fmt.Sprintf("%s is a symlink in this patch; refusing to write through it", DisplayPath(a)))
			return
		}
	}
	// The host's current entry.
	cur, curData, err := root.get(pf.Path)
	if errors.Is(err, ErrSymlinkInPath) {
		if anc := deletedAncestor(pf.Path, deleted); anc == "" {
			refuse(pf, StatusRefused, fmt.Sprintf("%v; refusing to write through it", err))
			return
		}
		cur = hostEntry{} // under a path the patch deletes first
	} else if err != nil {
		refuse(pf, StatusRefused, err.Error())
		return
	}
	if cur.Type == TypeDir && emptied[pf.Path] && pf.newT != "" {
		cur = hostEntry{} // the patch empties the directory, which then goes
	}
	pf.cur, pf.curT = cur, cur.Type
	switch cur.Type {
	case TypeFile:
		pf.curData = curData
	case TypeSymlink:
		pf.curData = []byte(cur.Target)
	}
	if cur.Type == TypeDir || cur.Type == TypeSpecial {
		refuse(pf, StatusRefused, fmt.Sprintf("a %s is in the way on the host", map[FileType]string{TypeDir: "directory", TypeSpecial: "special file"}[cur.Type]))
		return
	}
	// The old side (base) and the new content.
	if first.Op != OpAdd {
		base, known, err := findBase(ctx, root, objs, first, pf)
		if err != nil {
			refuse(pf, StatusRefused, err.Error())
			return
		}
		pf.oldData, pf.baseKnown = base, known
	} else {
		pf.baseKnown = true
	}
	if last.Op != OpDelete {
		from := pf.oldData
		if last != first {
			from = nil
		}
		nd, err := last.newContent(from)
		if err != nil {
			refuse(pf, StatusRefused, fmt.Sprintf("the patch does not fit its old content: %v", err))
			return
		}
		pf.newData = nd
		if last.HasIndex && last.NewID != "" && blobID(nd) != last.NewID && last.binary != nil {
			refuse(pf, StatusRefused, "binary content does not match the index line")
			return
		}
	}
	if pf.newT == TypeSymlink {
		t := string(pf.newData)
		if err := ValidateTarget(t); err != nil || strings.ContainsRune(t, '\n') {
			refuse(pf, StatusRefused, "bad symlink target")
			return
		}
		// Where it leads is judged over the final tree (checkFinalTree).
	}
	if pf.Attention == AttentionNone {
		switch {
		case pf.newT == TypeFile && manifestRiskOf(pf) != "":
			pf.attend(AttentionFlagged, manifestRiskOf(pf))
		case pf.newT == TypeSymlink && isManifest(pf.Path):
			// Judged by content only as a file: as a link, the tool reads
			// whatever it points to.
			pf.attend(AttentionFlagged, DisplayPath(filepath.Base(pf.Path))+" becomes a symlink: the tool runs what the file it points to says")
		case pf.newGitMode == ModeExec && pf.oldGitMode != ModeExec:
			pf.attend(AttentionFlagged, "becomes executable")
		case pf.newT == TypeFile && (pf.oldGitMode == ModeExec || pf.curT == TypeFile && pf.cur.Mode&0o111 != 0) &&
			!bytes.Equal(pf.oldData, pf.newData):
			pf.attend(AttentionFlagged, "an executable file: runs when you run it (bin/dev, ./configure, scripts)")
		}
	}
	why := ""
	if first.Op != OpAdd {
		why = unknown[pf.Path+"\x00"+first.OldID]
	}
	decide(pf, why)
}

func deletedAncestor(p string, deleted map[string]bool) string {
	for a := parentDir(p); a != ""; a = parentDir(a) {
		if deleted[a] {
			return a
		}
	}
	return ""
}

// oldType is the type of an entry's old side; a modify that names no mode
// is a regular file.
func oldType(fp *FilePatch) FileType {
	if fp.Op == OpAdd {
		return ""
	}
	if t := modeType(fp.OldMode); t != "" {
		return t
	}
	return TypeFile
}

func modeType(m uint32) FileType {
	switch m {
	case ModeSymlink:
		return TypeSymlink
	case 0:
		return ""
	}
	return TypeFile
}

// findBase returns the entry's old content: verified by blob id from the
// host file, the object store or the workspace's git store; without an
// index line, the host's current content (unverified, like git apply).
func findBase(ctx context.Context, root *hostRoot, objs *objectStore, fp *FilePatch, pf *PlannedFile) ([]byte, bool, error) {
	wantT := oldType(fp)
	if !fp.HasIndex {
		if pf.curT != wantT && pf.curT != "" {
			return nil, false, fmt.Errorf("the host has a %s where the patch expects a %s", pf.curT, wantT)
		}
		return pf.curData, pf.curT != "", nil
	}
	if fp.OldID == "" || blobID(nil) == fp.OldID {
		return []byte{}, true, nil
	}
	if pf.curT == wantT && blobID(pf.curData) == fp.OldID {
		return pf.curData, true, nil
	}
	if data, err := objs.get(fp.OldID); err == nil {
		return data, true, nil
	}
	if wantT == TypeFile {
		if data, err := gitCmd(ctx, root.path, "cat-file", "blob", fp.OldID); err == nil && blobID(data) == fp.OldID {
			return data, true, nil
		}
	}
	if fp.Op == OpDelete {
		return nil, false, nil // deleting needs no base: a differing host file is a conflict
	}
	if len(fp.hunks) == 0 && fp.binary != nil && !fp.binary.delta {
		return nil, false, nil // a literal needs no base either
	}
	if len(fp.hunks) == 0 && fp.binary == nil {
		return nil, false, nil // mode change only
	}
	return nil, false, fmt.Errorf("the old content (blob %s) is neither on the host nor in the session's objects; the patch was made against other files", fp.OldID[:12])
}

// state is a (type, content, git mode) triple for comparisons.
func sameState(t1 FileType, d1 []byte, m1 uint32, t2 FileType, d2 []byte, m2 uint32) bool {
	if t1 != t2 {
		return false
	}
	switch t1 {
	case "":
		return true
	case TypeSymlink:
		return bytes.Equal(d1, d2)
	}
	return bytes.Equal(d1, d2) && (m1 == 0 || m2 == 0 || m1 == m2)
}

func curGitMode(e hostEntry) uint32 { return gitMode(e.Type, e.Mode) }

// decide sets the status of a path whose base and new content are known.
// baseWhy, when not "", says why the patch's old side is not the version
// the agent started from.
func decide(pf *PlannedFile, baseWhy string) {
	baseUnknown := baseWhy != ""
	cm := curGitMode(pf.cur)
	newMode := pf.newGitMode
	oldMode := pf.oldGitMode
	last := pf.Entries[len(pf.Entries)-1]
	if pf.Op == OpModify && len(pf.Entries) == 1 && last.OldMode == 0 {
		// The patch did not say the mode (no index mode): keep the host's.
		newMode, oldMode = cm, cm
	}
	if sameState(pf.curT, pf.curData, cm, pf.newT, pf.newData, newMode) {
		pf.Status = StatusAlready
		return
	}
	oldKnown := pf.baseKnown
	if oldKnown && !baseUnknown && sameState(pf.curT, pf.curData, cm, pf.oldT, pf.oldData, oldMode) {
		pf.Status = StatusApply
		return
	}
	// The host differs from the patch's old side: both changed the path.
	c := &Conflict{Path: pf.Path}
	pf.Conflict = c
	pf.Status = StatusConflict
	text := pf.curT == TypeFile && pf.newT == TypeFile && !isBinary(pf.curData) && !isBinary(pf.newData)
	switch {
	case baseUnknown:
		c.Kind, c.Why = BaseUnknown, baseWhy
	case pf.oldT == "" && pf.curT != "":
		c.Kind = BothAdded
	case pf.curT == "":
		c.Kind = DeletedByYou
	case pf.newT == "":
		c.Kind = DeletedByAgent
	case pf.curT != pf.newT || pf.curT != pf.oldT:
		c.Kind = TypeChanged
	case pf.curT == TypeFile && bytes.Equal(pf.curData, pf.oldData) && oldKnown:
		c.Kind = ModeConflict
	case !text || !oldKnown || isBinary(pf.oldData):
		c.Kind = UnmergeableWrite
	default:
		c.Kind = BothModified
	}
	if pf.curT == TypeFile && pf.oldT == TypeFile && pf.newT == TypeFile && oldKnown && !baseUnknown && text && !isBinary(pf.oldData) {
		merged, clean := merge3(string(pf.oldData), string(pf.curData), string(pf.newData))
		modeOK := cm == oldMode || newMode == oldMode || cm == newMode
		if clean && modeOK {
			pf.Status, pf.Conflict, pf.merged = StatusMerged, nil, []byte(merged)
			if merged == string(pf.curData) && (newMode == oldMode || cm == newMode) {
				pf.Status = StatusAlready
			}
			return
		}
		if !clean {
			pf.marks = []byte(merged)
		}
	}
	if pf.marks == nil && text {
		pf.marks = []byte(merge2(string(pf.curData), string(pf.newData)))
	}
	c.Options = []Resolution{KeepMine, TakeAgent}
	if pf.marks != nil {
		c.Options = append(c.Options, WriteMarks)
	}
	if pf.Attention != AttentionNone {
		c.Why = joinWhy(c.Why, pf.Attention.String()+": "+pf.AttentionWhy)
	}
	pf.Why = string(c.Kind)
	if c.Why != "" {
		pf.Why += ": " + c.Why
	}
}

// merge2 writes two versions with conflict markers around each region where
// they differ (no base to tell which side changed).
func merge2(mine, theirs string) string {
	var out strings.Builder
	script := lineDiff(mine, theirs)
	var a, b []string
	flush := func() {
		if len(a) == 0 && len(b) == 0 {
			return
		}
		out.WriteString(markerMine + "\n")
		for _, l := range a {
			out.WriteString(l)
		}
		if len(a) > 0 && !strings.HasSuffix(a[len(a)-1], "\n") {
			out.WriteByte('\n')
		}
		out.WriteString(markerSep + "\n")
		for _, l := range b {
			out.WriteString(l)
		}
		if len(b) > 0 && !strings.HasSuffix(b[len(b)-1], "\n") {
			out.WriteByte('\n')
		}
		out.WriteString(markerTheirs + "\n")
		a, b = nil, nil
	}
	for _, l := range script {
		switch l.kind {
		case lineEqual:
			flush()
			out.WriteString(l.text)
		case lineDelete:
			a = append(a, l.text)
		case lineInsert:
			b = append(b, l.text)
		}
	}
	flush()
	return out.String()
}

// checkCollisions refuses paths that are one file on a case-insensitive or
// normalising file system (APFS, HFS+) with another path of the patch or an
// existing host entry of another spelling.
func checkCollisions(root *hostRoot, pl *Plan) {
	keys := map[string]*PlannedFile{}
	for _, pf := range pl.Files {
		if pf.newT == "" {
			continue
		}
		k := foldPath(pf.Path)
		if other, ok := keys[k]; ok && other.Path != pf.Path {
			why := fmt.Sprintf("%s and %s are the same file on macOS (case or Unicode normalisation); rename one", DisplayPath(other.Path), DisplayPath(pf.Path))
			for _, f := range []*PlannedFile{other, pf} {
				if f.Status != StatusSkipped {
					refuse(f, StatusRefused, why)
				}
			}
			continue
		}
		keys[k] = pf
	}
	listings := map[string]map[string][]string{} // dir -> fold -> names
	for _, pf := range pl.Files {
		if pf.newT == "" || pf.curT != "" || pf.Status == StatusRefused || pf.Status == StatusProtected || pf.Status == StatusSkipped {
			continue
		}
		dir := ""
		for comp := range strings.SplitSeq(pf.Path, "/") {
			l, ok := listings[dir]
			if !ok {
				names, _ := root.readDirNames(dir)
				l = map[string][]string{}
				for _, n := range names {
					if !strings.HasPrefix(n, tempPrefix) {
						l[foldName(n)] = append(l[foldName(n)], n)
					}
				}
				listings[dir] = l
			}
			for _, n := range l[foldName(comp)] {
				if n != comp {
					refuse(pf, StatusRefused, fmt.Sprintf("%s collides with the host's %s on macOS (case or Unicode normalisation); rename one", DisplayPath(join(dir, comp)), DisplayPath(join(dir, n))))
					break
				}
			}
			if pf.Status == StatusRefused {
				break
			}
			dir = join(dir, comp)
		}
	}
}

// gitHooksDir is the directory git runs the workspace's hooks from
// (core.hooksPath, else .git/hooks), relative to the workspace; "" when it
// is outside the workspace, there is no repository or no git.
func gitHooksDir(ctx context.Context, ws string) string {
	real, err := filepath.EvalSymlinks(ws)
	if err != nil {
		return ""
	}
	hooks, err := repoHooksDir(ctx, real)
	if err != nil {
		return "" // no repository, or no git
	}
	if h, err := filepath.EvalSymlinks(hooks); err == nil {
		hooks = h
	}
	rel, err := filepath.Rel(real, hooks)
	if err != nil || rel == "." || rel == ".." || strings.HasPrefix(rel, "../") || filepath.IsAbs(rel) {
		return ""
	}
	return filepath.ToSlash(rel)
}

func manifestRiskOf(pf *PlannedFile) string {
	why, _ := contentRisk(pf.Path, pf.oldData, pf.newData)
	return why
}

func isManifest(p string) bool {
	_, ok := contentRisk(p, nil, nil)
	return ok
}

// ReviewDiff is the diff the review shows for the path. For a merge it is
// the merged result (what the apply writes) against the user's file as it
// is now, not the agent's patch: the patch's old side is not what the user
// has, and a merge can drop a line that neither side dropped on its own
// (a wrong base). For a conflict between two files, the agent's patch and
// then what taking the agent's version does to the user's file. Otherwise
// the patch's own entries.
func (pf *PlannedFile) ReviewDiff() []byte {
	var b bytes.Buffer
	against := func(note string, data []byte, mode uint32) {
		fmt.Fprintf(&b, "# %s\n", note)
		f := PatchFile{Path: pf.Path, OldMode: curGitMode(pf.cur), NewMode: mode, OldID: blobID(pf.curData), NewID: blobID(data)}
		writeFileDiff(&b, &f, pf.curData, data)
	}
	switch {
	case pf.Status == StatusMerged && pf.curT == TypeFile:
		against("merged with your changes: the result against your file as it is now", pf.merged, gitMode(TypeFile, newPerm(pf)))
	case pf.Status == StatusConflict && pf.curT == TypeFile && pf.newT == TypeFile:
		for _, e := range pf.Entries {
			b.Write(e.Raw)
		}
		against("taking the agent's version would change your file as it is now like this", pf.newData, gitMode(TypeFile, newPerm(pf)))
	default:
		for _, e := range pf.Entries {
			b.Write(e.Raw)
		}
	}
	return b.Bytes()
}
