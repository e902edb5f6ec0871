package overlay

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// ErrBadPatch means a patch could not be parsed or fails validation. Patches
// are untrusted: a hand-made one may contain anything.
var ErrBadPatch = errors.New("bad patch")

// MaxPatchBytes is the largest patch ParsePatch reads.
const MaxPatchBytes = 4 << 30

// FilePatch is one parsed "diff --git" entry.
type FilePatch struct {
	PatchFile
	// HasIndex says the entry had an index line with full blob ids, so the
	// old content can be verified before anything is applied.
	HasIndex bool
	// Raw is the entry's text as it appeared in the patch.
	Raw []byte

	hunks  []hunk
	binary *binaryHunk // forward hunk of a GIT binary patch
}

type hunk struct {
	oldStart, oldCount, newStart, newCount int
	lines                                  []diffLine
}

// ParsePatch parses a git-style patch as BuildPatch writes it (and as
// `git diff --full-index --binary` does): add, delete, modify, mode changes,
// symlinks, text hunks and binary literal or delta hunks. Renames, copies and
// submodules are refused. Every path and field is validated; text before the
// first "diff --git" line is ignored.
func ParsePatch(data []byte) ([]*FilePatch, error) {
	if len(data) > MaxPatchBytes {
		return nil, fmt.Errorf("%w: larger than %d bytes", ErrBadPatch, MaxPatchBytes)
	}
	lines := splitLines(string(data))
	p := &patchParser{lines: lines}
	var out []*FilePatch
	seen := make(map[string]int) // path -> 1 deleted, 2 present
	for {
		fp, err := p.next()
		if err != nil {
			return nil, fmt.Errorf("%w: line %d: %v", ErrBadPatch, p.i+1, err)
		}
		if fp == nil {
			break
		}
		switch s := seen[fp.Path]; {
		case s == 0:
		case s == 1 && fp.Op == OpAdd:
		default:
			return nil, fmt.Errorf("%w: %s appears twice", ErrBadPatch, DisplayPath(fp.Path))
		}
		if fp.Op == OpDelete {
			seen[fp.Path] = 1
		} else {
			seen[fp.Path] = 2
		}
		if len(out) >= MaxChanges {
			return nil, fmt.Errorf("%w: more than %d entries", ErrBadPatch, MaxChanges)
		}
		out = append(out, fp)
	}
	return out, nil
}

type patchParser struct {
	lines []string
	i     int
}

func (p *patchParser) peek() (string, bool) {
	if p.i >= len(p.lines) {
		return "", false
	}
	return p.lines[p.i], true
}

// next parses the next entry, or returns nil at the end.
func (p *patchParser) next() (*FilePatch, error) {
	// Find the next header; outside entries only free text is allowed.
	for {
		l, ok := p.peek()
		if !ok {
			return nil, nil
		}
		if strings.HasPrefix(l, "diff --git ") {
			break
		}
		if l == "-- \n" { // mail signature: the patch is over
			return nil, nil
		}
		if strings.HasPrefix(l, "--- ") || strings.HasPrefix(l, "+++ ") || strings.HasPrefix(l, "@@ ") ||
			strings.HasPrefix(l, "GIT binary patch") || strings.HasPrefix(l, "diff ") {
			return nil, errors.New(`diff content outside a "diff --git" entry (only git-style patches are accepted; are a hunk's line counts wrong?)`)
		}
		p.i++
	}
	start := p.i
	fp := &FilePatch{}
	header := strings.TrimSuffix(p.lines[p.i], "\n")
	p.i++
	name, err := parseGitHeaderNames(header[len("diff --git "):])
	if err != nil {
		return nil, err
	}
	if err := ValidatePath(name); err != nil {
		return nil, err
	}
	fp.Path = name
	var mode, oldMode, newMode uint32
	isNew, isDel := false, false
	// Extended header lines.
headers:
	for {
		l, ok := p.peek()
		if !ok {
			break
		}
		t := strings.TrimSuffix(l, "\n")
		switch {
		case strings.HasPrefix(t, "old mode "):
			oldMode, err = parseMode(t[len("old mode "):])
		case strings.HasPrefix(t, "new mode "):
			newMode, err = parseMode(t[len("new mode "):])
		case strings.HasPrefix(t, "deleted file mode "):
			isDel = true
			oldMode, err = parseMode(t[len("deleted file mode "):])
		case strings.HasPrefix(t, "new file mode "):
			isNew = true
			newMode, err = parseMode(t[len("new file mode "):])
		case strings.HasPrefix(t, "index "):
			mode, err = p.parseIndex(fp, t[len("index "):])
		case strings.HasPrefix(t, "similarity index"), strings.HasPrefix(t, "dissimilarity index"),
			strings.HasPrefix(t, "rename "), strings.HasPrefix(t, "copy "):
			return nil, fmt.Errorf("renames and copies are not supported (%q)", truncate(t))
		default:
			break headers
		}
		if err != nil {
			return nil, err
		}
		p.i++
	}
	if isNew && isDel {
		return nil, errors.New("entry is both a new and a deleted file")
	}
	switch {
	case isNew:
		fp.Op, fp.NewMode = OpAdd, newMode
		if oldMode != 0 {
			return nil, errors.New("old mode on a new file")
		}
	case isDel:
		fp.Op, fp.OldMode = OpDelete, oldMode
		if newMode != 0 {
			return nil, errors.New("new mode on a deleted file")
		}
	default:
		fp.Op = OpModify
		if (oldMode == 0) != (newMode == 0) {
			return nil, errors.New("old mode without new mode or the other way round")
		}
		if oldMode == 0 {
			oldMode, newMode = mode, mode // 0 when unknown: keep the host's mode
		} else if mode != 0 {
			return nil, errors.New("index line has a mode although the mode changes")
		}
		fp.OldMode, fp.NewMode = oldMode, newMode
	}
	// Content.
	l, ok := p.peek()
	switch {
	case ok && strings.HasPrefix(l, "--- "):
		if err := p.parseNames(fp); err != nil {
			return nil, err
		}
		if err := p.parseHunks(fp); err != nil {
			return nil, err
		}
	case ok && l == "GIT binary patch\n":
		p.i++
		h, n, err := parseBinaryHunk(p.lines[p.i:])
		if err != nil {
			return nil, err
		}
		p.i += n
		fp.binary, fp.Binary = h, true
		if l, ok := p.peek(); ok && (strings.HasPrefix(l, "literal ") || strings.HasPrefix(l, "delta ")) {
			_, n, err := parseBinaryHunk(p.lines[p.i:]) // the reverse hunk: checked, unused
			if err != nil {
				return nil, fmt.Errorf("reverse binary hunk: %w", err)
			}
			p.i += n
		}
		if h.delta && fp.Op == OpAdd {
			return nil, errors.New("delta binary hunk on a new file")
		}
	case ok && strings.HasPrefix(l, "Binary files "):
		return nil, errors.New(`binary change without content ("Binary files … differ"): make the patch with --binary`)
	}
	if err := fp.check(); err != nil {
		return nil, fmt.Errorf("%s: %w", DisplayPath(fp.Path), err)
	}
	var raw bytes.Buffer
	for _, l := range p.lines[start:p.i] {
		raw.WriteString(l)
	}
	fp.Raw = raw.Bytes()
	return fp, nil
}

// check validates an entry's fields against each other.
func (fp *FilePatch) check() error {
	for _, m := range []uint32{fp.OldMode, fp.NewMode} {
		switch m {
		case 0, ModeFile, ModeExec, ModeSymlink:
		default:
			return fmt.Errorf("unsupported mode %06o (only 100644, 100755 and 120000)", m)
		}
	}
	if fp.Op == OpModify && fp.OldMode != 0 && (fp.OldMode == ModeSymlink) != (fp.NewMode == ModeSymlink) {
		return errors.New("type change inside one entry (git writes a delete and an add)")
	}
	if fp.Op == OpAdd && fp.OldID != "" && fp.OldID != zeroID {
		return errors.New("new file with an old blob id")
	}
	if fp.Op == OpDelete && fp.NewID != "" && fp.NewID != zeroID {
		return errors.New("deleted file with a new blob id")
	}
	for i, h := range fp.hunks {
		if fp.Op == OpAdd && (h.oldCount != 0 || len(fp.hunks) != 1) {
			return errors.New("new file with old lines")
		}
		if fp.Op == OpDelete && (h.newCount != 0 || len(fp.hunks) != 1) {
			return errors.New("deleted file with new lines")
		}
		if i > 0 {
			prev := fp.hunks[i-1]
			if h.oldStart < prev.oldStart+prev.oldCount {
				return errors.New("hunks overlap or are out of order")
			}
		}
	}
	if fp.binary != nil && fp.binary.delta && fp.OldID == "" {
		return errors.New("delta binary hunk without an index line")
	}
	return nil
}

func parseMode(s string) (uint32, error) {
	m, err := strconv.ParseUint(strings.TrimSpace(s), 8, 32)
	if err != nil || m == 0 {
		return 0, fmt.Errorf("bad mode %q", truncate(s))
	}
	return uint32(m), nil
}

// parseIndex reads "OLD..NEW[ MODE]". Abbreviated ids are accepted but give
// no verification (HasIndex stays false).
func (p *patchParser) parseIndex(fp *FilePatch, s string) (uint32, error) {
	ids, modeStr, hasMode := strings.Cut(s, " ")
	o, n, ok := strings.Cut(ids, "..")
	if !ok || !isHex(o) || !isHex(n) || len(o) < 4 || len(n) < 4 || len(o) > 64 || len(n) > 64 {
		return 0, fmt.Errorf("bad index line %q", truncate(s))
	}
	if len(o) == 40 && len(n) == 40 {
		fp.OldID, fp.NewID, fp.HasIndex = o, n, true
		if o == zeroID {
			fp.OldID = ""
		}
		if n == zeroID {
			fp.NewID = ""
		}
	}
	if !hasMode {
		return 0, nil
	}
	return parseMode(modeStr)
}

func isHex(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// parseGitHeaderNames reads "a/NAME b/NAME" (either may be C-quoted) and
// returns NAME; the two must be the same path (no renames).
func parseGitHeaderNames(s string) (string, error) {
	bad := fmt.Errorf("bad diff --git header names %q", truncate(s))
	var a, b string
	if strings.HasPrefix(s, `"`) {
		n, rest, err := gitUnquote(s)
		if err != nil || !strings.HasPrefix(rest, " ") {
			return "", bad
		}
		a, s = n, rest[1:]
		if strings.HasPrefix(s, `"`) {
			n, rest, err := gitUnquote(s)
			if err != nil || rest != "" {
				return "", bad
			}
			b = n
		} else {
			b = s
		}
	} else if strings.HasSuffix(s, `"`) {
		i := strings.Index(s, ` "`)
		if i < 0 {
			return "", bad
		}
		n, rest, err := gitUnquote(s[i+1:])
		if err != nil || rest != "" {
			return "", bad
		}
		a, b = s[:i], n
	} else {
		// Unquoted: the two halves are equal, so the split is in the middle.
		if len(s) < 7 || (len(s)-1)%2 != 0 {
			return "", bad
		}
		h := (len(s) - 1) / 2
		if s[h] != ' ' {
			return "", bad
		}
		a, b = s[:h], s[h+1:]
	}
	if !strings.HasPrefix(a, "a/") || !strings.HasPrefix(b, "b/") || a[2:] != b[2:] {
		return "", fmt.Errorf("%v: old and new names must be the same a/PATH b/PATH (renames are not supported)", bad)
	}
	return a[2:], nil
}

// parseHeaderName reads a ---/+++ name: "/dev/null", a C-quoted name, or a
// name up to a tab or the end of the line.
func parseHeaderName(s string) (string, error) {
	s = strings.TrimSuffix(s, "\n")
	if strings.HasPrefix(s, `"`) {
		n, rest, err := gitUnquote(s)
		if err != nil || (rest != "" && rest[0] != '\t') {
			return "", fmt.Errorf("bad file name %q", truncate(s))
		}
		return n, nil
	}
	if i := strings.IndexByte(s, '\t'); i >= 0 {
		s = s[:i]
	}
	return s, nil
}

func (p *patchParser) parseNames(fp *FilePatch) error {
	from, err := parseHeaderName(p.lines[p.i][4:])
	if err != nil {
		return err
	}
	p.i++
	l, ok := p.peek()
	if !ok || !strings.HasPrefix(l, "+++ ") {
		return errors.New(`"---" line without "+++"`)
	}
	to, err := parseHeaderName(l[4:])
	if err != nil {
		return err
	}
	p.i++
	wantFrom, wantTo := "a/"+fp.Path, "b/"+fp.Path
	if fp.Op == OpAdd {
		wantFrom = "/dev/null"
	}
	if fp.Op == OpDelete {
		wantTo = "/dev/null"
	}
	if from != wantFrom || to != wantTo {
		return fmt.Errorf("---/+++ names %s and %s do not match the header's %s", DisplayPath(from), DisplayPath(to), DisplayPath(fp.Path))
	}
	return nil
}

func parseHunkHeader(l string) (h hunk, err error) {
	bad := fmt.Errorf("bad hunk header %q", truncate(l))
	rest, ok := strings.CutPrefix(l, "@@ -")
	if !ok {
		return h, bad
	}
	oldR, rest, ok := strings.Cut(rest, " +")
	if !ok {
		return h, bad
	}
	newR, _, ok := strings.Cut(rest, " @@")
	if !ok {
		return h, bad
	}
	num := func(r string) (int, int, error) {
		a, b, has := strings.Cut(r, ",")
		s, err := strconv.Atoi(a)
		if err != nil || s < 0 || s > 1<<30 {
			return 0, 0, bad
		}
		c := 1
		if has {
			if c, err = strconv.Atoi(b); err != nil || c < 0 || c > 1<<30 {
				return 0, 0, bad
			}
		}
		return s, c, nil
	}
	if h.oldStart, h.oldCount, err = num(oldR); err != nil {
		return h, err
	}
	if h.newStart, h.newCount, err = num(newR); err != nil {
		return h, err
	}
	if (h.oldCount > 0 && h.oldStart == 0) || (h.newCount > 0 && h.newStart == 0) {
		return h, bad
	}
	return h, nil
}

func (p *patchParser) parseHunks(fp *FilePatch) error {
	for {
		l, ok := p.peek()
		if !ok || !strings.HasPrefix(l, "@@ ") {
			break
		}
		h, err := parseHunkHeader(strings.TrimSuffix(l, "\n"))
		if err != nil {
			return err
		}
		p.i++
		o, n := h.oldCount, h.newCount
		for o > 0 || n > 0 {
			l, ok := p.peek()
			if !ok {
				return errors.New("hunk ends early (line counts in the @@ header are larger than its lines)")
			}
			var k lineKind
			text := l
			switch {
			case l == "\n": // an empty context line whose space was stripped
				k, text = lineEqual, "\n"
			case l[0] == ' ' || l[0] == '-' || l[0] == '+':
				k, text = lineKind(l[0]), l[1:]
			default:
				return fmt.Errorf("unexpected line in hunk %q (line counts in the @@ header wrong?)", truncate(l))
			}
			if !strings.HasSuffix(text, "\n") {
				return errors.New("patch ends inside a hunk line")
			}
			switch k {
			case lineEqual:
				o, n = o-1, n-1
			case lineDelete:
				o--
			case lineInsert:
				n--
			}
			if o < 0 || n < 0 {
				return errors.New("hunk has more lines than its @@ header says")
			}
			p.i++
			if nl, ok := p.peek(); ok && strings.HasPrefix(nl, `\ `) {
				text = strings.TrimSuffix(text, "\n")
				p.i++
			}
			h.lines = append(h.lines, diffLine{k, text})
		}
		if l, ok := p.peek(); ok && strings.HasPrefix(l, `\ `) {
			return errors.New(`misplaced "\ No newline at end of file"`)
		}
		for _, dl := range h.lines {
			switch dl.kind {
			case lineInsert:
				fp.Added++
			case lineDelete:
				fp.Deleted++
			}
		}
		fp.hunks = append(fp.hunks, h)
	}
	if len(fp.hunks) == 0 {
		return errors.New(`"---"/"+++" lines without a hunk`)
	}
	return nil
}

// applyHunks applies text hunks to base exactly at their stated positions
// (the base is verified by blob id where the patch has one; no fuzz).
func applyHunks(base []byte, hunks []hunk) ([]byte, error) {
	lines := splitLines(string(base))
	var out strings.Builder
	out.Grow(len(base) + 1024)
	pos := 0 // next unconsumed base line (0-based)
	for hi, h := range hunks {
		start := h.oldStart - 1
		if h.oldCount == 0 {
			start = h.oldStart
		}
		if start < pos || start > len(lines) {
			return nil, fmt.Errorf("hunk %d starts at line %d, outside the file", hi+1, h.oldStart)
		}
		for _, l := range lines[pos:start] {
			out.WriteString(l)
		}
		pos = start
		for _, dl := range h.lines {
			switch dl.kind {
			case lineEqual, lineDelete:
				if pos >= len(lines) || lines[pos] != dl.text {
					return nil, fmt.Errorf("hunk %d does not match the file at line %d", hi+1, pos+1)
				}
				if dl.kind == lineEqual {
					out.WriteString(dl.text)
				}
				pos++
			case lineInsert:
				out.WriteString(dl.text)
			}
		}
	}
	for _, l := range lines[pos:] {
		out.WriteString(l)
	}
	return []byte(out.String()), nil
}

// newContent computes the entry's new content from its old content.
func (fp *FilePatch) newContent(old []byte) ([]byte, error) {
	switch {
	case fp.Op == OpDelete:
		return nil, nil
	case fp.binary != nil:
		if fp.binary.delta {
			return applyDelta(old, fp.binary.data)
		}
		return fp.binary.data, nil
	case len(fp.hunks) == 0:
		if fp.Op == OpAdd {
			return nil, nil
		}
		return old, nil // mode change only
	}
	return applyHunks(old, fp.hunks)
}
