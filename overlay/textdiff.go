package overlay

import (
	"bytes"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/sergi/go-diff/diffmatchpatch"
)

// contextLines is the number of unchanged lines around each hunk.
const contextLines = 3

// maxDiffLines is the most lines (old plus new) a text diff handles; go-diff
// maps each distinct line to one rune, so larger files are sent as binary.
const maxDiffLines = 1_000_000

// binarySniffLen is how much of a file git looks at for a NUL byte.
const binarySniffLen = 8000

// isBinary reports whether git would treat data as binary.
func isBinary(data []byte) bool {
	if len(data) > binarySniffLen {
		data = data[:binarySniffLen]
	}
	return bytes.IndexByte(data, 0) >= 0
}

type lineKind byte

const (
	lineEqual  lineKind = ' '
	lineDelete lineKind = '-'
	lineInsert lineKind = '+'
)

type diffLine struct {
	kind lineKind
	text string // with its "\n", unless it is a file's unterminated last line
}

// splitLines cuts s after every "\n"; a last line without one is kept.
func splitLines(s string) []string {
	if s == "" {
		return nil
	}
	lines := make([]string, 0, strings.Count(s, "\n")+1)
	for s != "" {
		i := strings.IndexByte(s, '\n')
		if i < 0 {
			lines = append(lines, s)
			break
		}
		lines = append(lines, s[:i+1])
		s = s[i+1:]
	}
	return lines
}

// lineDiff returns the line edit script from a to b, computed with go-diff in
// line mode (each distinct line becomes one character, the character strings
// are diffed, then turned back into lines).
func lineDiff(a, b string) []diffLine {
	dmp := diffmatchpatch.New()
	// Past the timeout the diff is still correct, only less minimal.
	dmp.DiffTimeout = diffTime.take()
	if diffTimeoutHook != nil {
		diffTimeoutHook(dmp.DiffTimeout)
	}
	start := time.Now()
	ca, cb, lines := dmp.DiffLinesToChars(a, b)
	diffs := dmp.DiffCharsToLines(dmp.DiffMain(ca, cb, false), lines)
	diffTime.spend(time.Since(start))
	out := make([]diffLine, 0, len(diffs)*2)
	for _, d := range diffs {
		k := lineEqual
		switch d.Type {
		case diffmatchpatch.DiffDelete:
			k = lineDelete
		case diffmatchpatch.DiffInsert:
			k = lineInsert
		}
		for _, l := range splitLines(d.Text) {
			out = append(out, diffLine{k, l})
		}
	}
	return out
}

// tooManyLines reports whether a and b together exceed maxDiffLines.
func tooManyLines(a, b []byte) bool {
	return bytes.Count(a, []byte{'\n'})+bytes.Count(b, []byte{'\n'}) > maxDiffLines-2
}

// writeHunks writes unified hunks with contextLines of context for the edit
// script, and returns the number of added and deleted lines.
func writeHunks(w *bytes.Buffer, script []diffLine) (added, deleted int) {
	n := len(script)
	i := 0
	cur, oldN, newN := 0, 0, 0 // line counts of script[:cur]
	for i < n {
		// Find the next change.
		for i < n && script[i].kind == lineEqual {
			i++
		}
		if i == n {
			break
		}
		start := max(i-contextLines, 0)
		// Extend the hunk while changes are within 2*context of each other.
		end := i
		for {
			for end < n && script[end].kind != lineEqual {
				end++
			}
			j := end
			for j < n && script[j].kind == lineEqual && j-end < 2*contextLines+1 {
				j++
			}
			if j < n && script[j].kind != lineEqual && j-end <= 2*contextLines {
				end = j
				continue
			}
			break
		}
		stop := min(end+contextLines, n)
		// Line numbers: count old/new lines before start.
		for ; cur < start; cur++ {
			if script[cur].kind != lineInsert {
				oldN++
			}
			if script[cur].kind != lineDelete {
				newN++
			}
		}
		oldStart, newStart := oldN, newN
		oldCount, newCount := 0, 0
		for _, l := range script[start:stop] {
			if l.kind != lineInsert {
				oldCount++
			}
			if l.kind != lineDelete {
				newCount++
			}
		}
		fmt.Fprintf(w, "@@ -%s +%s @@\n", hunkRange(oldStart, oldCount), hunkRange(newStart, newCount))
		for _, l := range script[start:stop] {
			switch l.kind {
			case lineInsert:
				added++
			case lineDelete:
				deleted++
			}
			w.WriteByte(byte(l.kind))
			w.WriteString(l.text)
			if !strings.HasSuffix(l.text, "\n") {
				w.WriteString("\n\\ No newline at end of file\n")
			}
		}
		i = stop
	}
	return added, deleted
}

// hunkRange formats one side of a hunk header: the 1-based first line and
// the count, ",1" omitted; an empty side names the line before it.
func hunkRange(before, count int) string {
	switch count {
	case 0:
		return fmt.Sprintf("%d,0", before)
	case 1:
		return fmt.Sprintf("%d", before+1)
	}
	return fmt.Sprintf("%d,%d", before+1, count)
}

// Line diffs get at most maxFileDiffTime each and maxDiffTime in all (one
// process: one session's patch, then its applies): hostile files, every
// line different, would otherwise take the whole per-file time each, hours
// for a change set of thousands. Past the budget a diff gets
// minDiffTime: common starts and ends are still trimmed, the middle is
// one delete and one insert.
const (
	maxFileDiffTime = 5 * time.Second
	maxDiffTime     = 60 * time.Second
	minDiffTime     = time.Microsecond
)

type diffBudget struct {
	mu   sync.Mutex
	left time.Duration
}

var diffTime = &diffBudget{left: maxDiffTime}

// diffTimeoutHook, when set (tests), is told the time each diff is granted.
var diffTimeoutHook func(time.Duration)

func (b *diffBudget) take() time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	return max(min(maxFileDiffTime, b.left), minDiffTime)
}

func (b *diffBudget) spend(d time.Duration) {
	b.mu.Lock()
	b.left -= d
	b.mu.Unlock()
}
