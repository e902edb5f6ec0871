//go:build unix

package overlay

import (
	"fmt"
	"io/fs"
	"os"
	"slices"
	"strings"
)

// Bounds of the final-tree checks.
const (
	// maxLinkHops is how many symlinks one resolution follows (Linux's
	// limit); more is a loop.
	maxLinkHops = 40
	// maxHostWalk is how many host entries are visited looking for the
	// host's own symlinks (only when the patch changes a symlink).
	maxHostWalk = 1_000_000
	// maxResolveSteps bounds the work of one resolution and maxResolveBudget
	// that of one whole check, counted in bytes of path looked up and
	// components moved (a real link costs about a thousand; 40 hops of
	// 2,000-component targets cost tens of millions), so that hostile chains
	// cost the host a bounded time however many links name them. A link past
	// either is protected, never applied unjudged.
	maxResolveSteps  = 1 << 20
	maxResolveBudget = 256 << 20
	// maxResolvedLen bounds the length of a path being resolved.
	maxResolvedLen = 4 * MaxPathLen
)

// resolveStepHook, when set (tests), is told the work of every resolution.
var resolveStepHook func(units int)

// finalTree is the workspace as it would be with the whole patch applied:
// the host's entries overlaid with the patch's (refused ones too, so a
// combination is judged whatever the user later allows). Lookups never
// follow a symlink on the host. Patch paths are matched folded, as a
// case-insensitive file system would.
type finalTree struct {
	root  *hostRoot
	patch map[string]*PlannedFile // folded path -> entry; nil: the host alone
	dirs  map[string]bool         // folded paths the patch makes directories
	// dirsExact holds the same directories as the patch spells them.
	dirsExact map[string]bool
	host      map[string]hostEntry
	names     map[string][]string // dir -> host names
	// kids maps a folded directory to the class keys of the names the
	// patch puts in it.
	kids map[string]map[string]bool
	// budget is how many resolution steps are left (maxResolveBudget);
	// exhausted is set once a resolution ran out of steps.
	budget    int
	exhausted bool
}

func newFinalTree(root *hostRoot, pl *Plan) *finalTree {
	t := &finalTree{root: root, patch: map[string]*PlannedFile{}, dirs: map[string]bool{}, dirsExact: map[string]bool{},
		host: map[string]hostEntry{}, names: map[string][]string{}, budget: maxResolveBudget}
	t.kids = map[string]map[string]bool{}
	for _, pf := range pl.Files {
		t.patch[foldPath(pf.Path)] = pf
		if pf.newT == "" {
			continue
		}
		for p := pf.Path; p != ""; p = parentDir(p) {
			d, base := splitParent(p)
			fd := foldPath(d)
			if d != "" {
				t.dirs[fd] = true
				t.dirsExact[d] = true
			}
			if t.kids[fd] == nil {
				t.kids[fd] = map[string]bool{}
			}
			t.kids[fd][classKey(base)] = true
		}
	}
	return t
}

// hostOnly is the same host without the patch (shares the host cache).
func (t *finalTree) hostOnly() *finalTree {
	return &finalTree{root: t.root, host: t.host, names: t.names, budget: maxResolveBudget}
}

func (t *finalTree) hostEntry(p string) hostEntry {
	e, ok := t.host[p]
	if !ok {
		var err error
		if e, err = t.root.lstat(p); err != nil {
			e = hostEntry{} // behind a host symlink: nothing there for us
		}
		t.host[p] = e
	}
	return e
}

// lookup returns the type (and symlink target) of p in the tree, and the
// patch entry that decided it (nil: the host).
func (t *finalTree) lookup(p string) (FileType, string, *PlannedFile) {
	if t.patch != nil {
		k := foldPath(p)
		pf, ok := t.patch[k]
		if (ok && pf.Path != p || !ok && t.dirs[k] && !t.dirsExact[p]) && t.hostHasExactly(p) {
			// The patch has this name in another spelling only, and the
			// host has it in this one: on a case-sensitive file system
			// they are two entries, and on an insensitive one the other
			// spelling is refused as a collision. Either way the host's
			// entry is what this path is.
			e := t.hostEntry(p)
			return e.Type, e.Target, nil
		}
		if ok {
			switch {
			case pf.newT == TypeSymlink && pf.newData != nil:
				return TypeSymlink, string(pf.newData), pf
			case pf.newT == TypeSymlink, pf.newT == "":
				if t.dirs[k] {
					return TypeDir, "", pf
				}
				return "", "", pf
			}
			return pf.newT, "", pf
		}
		if t.dirs[k] {
			return TypeDir, "", nil
		}
	}
	e := t.hostEntry(p)
	return e.Type, e.Target, nil
}

// resolution is where a path leads after following every symlink.
type resolution struct {
	path    string   // the resolved path ("" is the workspace root)
	typ     FileType // what is there ("" absent)
	escapes bool     // climbs above the workspace or is absolute
	loop    bool     // more than maxLinkHops symlinks
	// complex: past maxResolveSteps, maxResolvedLen or the tree's budget.
	complex bool
	via     []*PlannedFile
}

// resolve follows p through the tree as the kernel would (each symlink
// replaced by its target, ".." applied to what it resolved to), with
// missing components taken lexically.
func (t *finalTree) resolve(p string) resolution {
	var r resolution
	var stack []string
	rest := strings.Split(p, "/")
	hops, steps, length := 0, 0, 0
	defer func() {
		t.budget -= steps
		if resolveStepHook != nil {
			resolveStepHook(steps)
		}
	}()
	for len(rest) > 0 {
		if steps += length + 1; steps > maxResolveSteps || length > maxResolvedLen || t.budget-steps <= 0 {
			r.complex, t.exhausted = true, true
			return r
		}
		c := rest[0]
		rest = rest[1:]
		switch c {
		case "", ".":
			continue
		case "..":
			if len(stack) == 0 {
				r.escapes = true
				return r
			}
			length -= len(stack[len(stack)-1]) + 1
			stack = stack[:len(stack)-1]
			continue
		}
		cur := strings.Join(append(stack[:len(stack):len(stack)], c), "/")
		typ, target, pf := t.lookup(cur)
		if pf != nil {
			r.via = append(r.via, pf)
		}
		if typ == TypeSymlink {
			if hops++; hops > maxLinkHops {
				r.loop = true
				return r
			}
			if strings.HasPrefix(target, "/") || target == "" {
				r.escapes = true
				return r
			}
			steps += len(rest)
			rest = append(strings.Split(target, "/"), rest...)
			continue
		}
		stack = append(stack, c)
		length += len(c) + 1
		if typ != TypeDir && typ != "" && len(rest) > 0 {
			// Not a directory: the kernel stops here (ENOTDIR).
			r.path, r.typ = cur, typ
			return r
		}
	}
	r.path, r.typ = strings.Join(stack, "/"), TypeDir
	if r.path != "" {
		r.typ, _, _ = t.lookup(r.path)
	}
	return r
}

// hostHasExactly reports whether the host's directory holds p's name in
// exactly that spelling (readdir's, not a case-insensitive lookup's).
func (t *finalTree) hostHasExactly(p string) bool {
	d, base := splitParent(p)
	names, ok := t.names[d]
	if !ok {
		names, _ = t.root.readDirNames(d)
		t.names[d] = names
	}
	return slices.Contains(names, base)
}

// childKeys lists the class keys of the names in directory d of the tree.
func (t *finalTree) childKeys(d string) map[string]bool {
	names, ok := t.names[d]
	if !ok {
		names, _ = t.root.readDirNames(d)
		t.names[d] = names
	}
	keys := map[string]bool{}
	fd := foldPath(d)
	for _, n := range names {
		p := join(d, n)
		if t.patch != nil {
			if pf, ok := t.patch[foldPath(p)]; ok && pf.newT == "" && !t.dirs[foldPath(p)] {
				continue // the patch deletes it
			}
		}
		keys[classKey(n)] = true
	}
	for k := range t.kids[fd] {
		keys[k] = true
	}
	return keys
}

// gitDirLike reports whether git would take directory d of the tree as a
// repository (a gitdir or a bare repository): it has HEAD and either
// objects/ and refs/, or a commondir file naming where they are.
func (t *finalTree) gitDirLike(d string, cache map[string]bool) bool {
	if v, ok := cache[d]; ok {
		return v
	}
	k := t.childKeys(d)
	v := k["head"] && ((k["objects"] && k["refs"]) || k["commondir"])
	cache[d] = v
	return v
}

// gitRepoAbove returns the nearest directory at or above p (p itself when
// self) that git would take as a repository, and whether there is one.
func (t *finalTree) gitRepoAbove(p string, self bool, cache map[string]bool) (string, bool) {
	d := p
	if !self {
		d = parentDir(p)
	}
	for {
		if t.gitDirLike(d, cache) {
			return d, true
		}
		if d == "" {
			return "", false
		}
		d = parentDir(d)
	}
}

// hostSymlinks lists the host's symlinks (path -> target), visiting at most
// limit entries and never entering .git or following a symlink. complete
// is false when the limit stopped it.
func (r *hostRoot) hostSymlinks(limit int) (map[string]string, bool) {
	out := map[string]string{}
	n := 0
	queue := []string{""}
	for len(queue) > 0 {
		dir := queue[0]
		queue = queue[1:]
		fd, _, err := r.openDir(dir, false)
		if err != nil {
			continue
		}
		f := os.NewFile(uintptr(fd), dir)
		ents, _ := f.ReadDir(-1)
		f.Close()
		for _, e := range ents {
			if n++; n > limit {
				return out, false
			}
			p := join(dir, e.Name())
			switch {
			case e.Type()&fs.ModeSymlink != 0:
				if he, err := r.lstat(p); err == nil && he.Type == TypeSymlink {
					out[p] = he.Target
				}
			case e.IsDir() && !isDotGit(classKey(e.Name())):
				queue = append(queue, p)
			}
		}
	}
	return out, true
}

// linkVerdict is what a symlink in the tree amounts to.
type linkVerdict struct {
	outside   bool // escapes or loops
	attention Attention
	why       string
}

// judgeLink classifies the symlink at p of the tree by where it leads: out
// of the workspace, into a protected or flagged path, into a directory git
// would take as a repository, or to a directory above itself.
func (t *finalTree) judgeLink(p string, gitCache map[string]bool) (linkVerdict, resolution) {
	r := t.resolve(p)
	var v linkVerdict
	switch {
	case r.loop:
		v.outside, v.why = true, "symlink does not resolve (a loop of more than 40 links)"
		return v, r
	case r.escapes:
		v.outside, v.why = true, "symlink points outside the workspace"
		return v, r
	case r.complex:
		v.attention, v.why = AttentionProtected, tooComplexWhy
		return v, r
	}
	raise := func(a Attention, why string) {
		if a > v.attention {
			v.attention, v.why = a, why
		}
	}
	target := r.path
	if target == "" || target == parentDir(p) || strings.HasPrefix(parentDir(p)+"/", target+"/") {
		raise(AttentionFlagged, "symlink points to a directory above it (paths through it climb the tree)")
	}
	if target != "" {
		var a Attention
		var why string
		if r.typ == TypeFile {
			a, why = ClassifyPath(target)
		} else {
			a, why = ClassifyDir(target)
		}
		if a != AttentionNone {
			raise(a, fmt.Sprintf("symlink to %s: %s", DisplayPath(target), why))
		}
		if repo, ok := t.gitRepoAbove(target, true, gitCache); ok {
			raise(AttentionProtected, fmt.Sprintf("symlink into %s, which git would take as a repository", displayDir(repo)))
		}
	}
	return v, r
}

const tooComplexWhy = "symlink too complex to judge (its resolution takes more than the steps vibedom follows)"

func displayDir(d string) string {
	if d == "" {
		return "the workspace root"
	}
	return DisplayPath(d) + "/"
}

func (v linkVerdict) severity() int {
	if v.outside {
		return 3
	}
	return int(v.attention)
}

// checkFinalTree judges what only the whole tree shows, over the host's
// entries and every entry of the patch together (so splitting an attack
// across selections or applies does not hide it):
//
//   - a path inside a directory git would take as a repository is
//     protected (the red team's X/HEAD, X/config, X/objects/…, X/refs/…);
//   - a symlink is judged by what it resolves to, following the host's and
//     the patch's symlinks: out of the workspace or a loop is refused (unless
//     --allow-outside-symlinks); into a protected path or a repository is
//     protected; into a flagged path, or to a directory above itself, is
//     flagged;
//   - a symlink of the patch that makes one of the host's symlinks resolve
//     somewhere worse than before is judged as if it led there itself.
func checkFinalTree(root *hostRoot, pl *Plan, opts ApplyOptions) {
	t := newFinalTree(root, pl)
	gitCache := map[string]bool{}
	live := func(pf *PlannedFile) bool {
		return pf.Status == StatusApply || pf.Status == StatusMerged || pf.Status == StatusConflict
	}
	protect := func(pf *PlannedFile, why string) {
		if !live(pf) {
			return
		}
		pf.attend(AttentionProtected, why)
		if !allowedBy(pf.Path, opts.AllowProtected) {
			refuse(pf, StatusProtected, fmt.Sprintf("protected path: %s; to apply it anyway: --allow-protected %s", why, pf.Path))
		}
	}
	apply := func(pf *PlannedFile, v linkVerdict, prefix string) {
		if !live(pf) {
			return
		}
		why := prefix + v.why
		switch {
		case v.outside && !opts.AllowOutsideSymlinks:
			refuse(pf, StatusRefused, why+"; to apply it anyway: --allow-outside-symlinks")
		case v.outside:
			if pf.Attention < AttentionFlagged {
				pf.attend(AttentionFlagged, why)
			}
		case v.attention == AttentionProtected:
			protect(pf, why)
		case v.attention > pf.Attention:
			pf.attend(v.attention, why)
		}
	}
	for _, pf := range pl.Files {
		if !live(pf) {
			continue
		}
		if repo, ok := t.gitRepoAbove(pf.Path, false, gitCache); ok {
			protect(pf, fmt.Sprintf("%s would be a git repository (HEAD, objects/, refs/): git run there reads its config and hooks", displayDir(repo)))
		}
	}
	// through classifies a patch file that the symlink at link resolves to
	// under the link's name too: Makefile -> build/rules.txt makes an edit
	// of rules.txt an edit of the Makefile.
	through := func(link string, r resolution) {
		if r.complex || r.loop || r.escapes || r.typ != TypeFile {
			return
		}
		pf := t.patch[foldPath(r.path)]
		if pf == nil || !live(pf) || pf.newT != TypeFile {
			return
		}
		a, why := ClassifyPath(link)
		if a == AttentionNone {
			if w, _ := contentRisk(link, pf.oldData, pf.newData); w != "" {
				a, why = AttentionFlagged, w
			}
		}
		if a == AttentionNone {
			return
		}
		why = fmt.Sprintf("%s points to it: %s", DisplayPath(link), why)
		if a == AttentionProtected {
			protect(pf, why)
		} else if a > pf.Attention {
			pf.attend(a, why)
		}
	}
	touchesLinks := false
	for _, pf := range pl.Files {
		if pf.newT == TypeSymlink || pf.oldT == TypeSymlink || pf.curT == TypeSymlink {
			touchesLinks = true
		}
		if pf.newT == TypeSymlink && live(pf) {
			v, r := t.judgeLink(pf.Path, gitCache)
			if v.outside && r.path == "" {
				v.why += " (" + DisplayPath(string(pf.newData)) + ")"
			}
			apply(pf, v, "")
			through(pf.Path, r)
		}
	}
	defer func() {
		if !t.exhausted {
			return
		}
		// Some resolution ran out of steps: what it would have shown is
		// unknown, so no symlink change of the patch is applied unjudged.
		for _, pf := range pl.Files {
			if pf.newT == TypeSymlink || pf.oldT == TypeSymlink || pf.curT == TypeSymlink {
				if pf.Attention < AttentionProtected {
					protect(pf, tooComplexWhy+": the patch's symlinks could not all be judged")
				}
			}
		}
	}()
	// The host's own symlinks: what they lead to, and (when the patch
	// touches a symlink) where they lead before and after.
	links, _ := root.hostSymlinks(maxHostWalk)
	before, beforeGit := t.hostOnly(), map[string]bool{}
	paths := make([]string, 0, len(links))
	for p := range links {
		paths = append(paths, p)
	}
	slices.Sort(paths)
	for _, p := range paths {
		if _, ok := t.patch[foldPath(p)]; ok {
			continue // the patch's own entry was judged above
		}
		reachable := true
		for a := parentDir(p); a != "" && reachable; a = parentDir(a) {
			typ, _, _ := t.lookup(a)
			reachable = typ == TypeDir
		}
		if !reachable {
			continue
		}
		after, r := t.judgeLink(p, gitCache)
		through(p, r)
		if !touchesLinks || after.severity() == 0 {
			continue
		}
		if was, _ := before.judgeLink(p, beforeGit); after.severity() <= was.severity() {
			continue
		}
		for _, pf := range r.via {
			if pf.newT == TypeSymlink || pf.oldT == TypeSymlink || pf.curT == TypeSymlink {
				apply(pf, after, fmt.Sprintf("with it, the host's symlink %s changes: ", DisplayPath(p)))
			}
		}
	}
}
