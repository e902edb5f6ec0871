package review

import (
	"bytes"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/vibedom/vibedom/overlay"
	"github.com/vibedom/vibedom/termtext"
)

// ANSI styles.
const (
	styleReset  = "\x1b[0m"
	styleBold   = "\x1b[1m"
	styleRed    = "\x1b[31m"
	styleGreen  = "\x1b[32m"
	styleYellow = "\x1b[33m"
	styleCyan   = "\x1b[36m"
	// Reverse video on and off, leaving the color alone.
	styleReverse   = "\x1b[7m"
	styleNoReverse = "\x1b[27m"
)

type painter bool

func (p painter) paint(style, s string) string {
	if !p || style == "" {
		return s
	}
	return style + s + styleReset
}

// Totals counts a plan's files and lines.
type Totals struct {
	Added, Modified, Deleted int
	LinesAdded, LinesDeleted int
	Protected, Refused       int
	Flagged, Conflicts       int
	AlreadyApplied, Selected int
}

// Count totals a plan.
func Count(pl *overlay.Plan) Totals {
	var t Totals
	for _, f := range pl.Files {
		switch f.Op {
		case overlay.OpAdd:
			t.Added++
		case overlay.OpDelete:
			t.Deleted++
		default:
			t.Modified++
		}
		t.LinesAdded += f.Added
		t.LinesDeleted += f.Deleted
		switch f.Status {
		case overlay.StatusProtected:
			t.Protected++
		case overlay.StatusRefused:
			t.Refused++
		case overlay.StatusConflict:
			t.Conflicts++
		case overlay.StatusAlready:
			t.AlreadyApplied++
		}
		if f.Attention == overlay.AttentionFlagged {
			t.Flagged++
		}
	}
	return t
}

func opLetter(op overlay.Op) string {
	switch op {
	case overlay.OpAdd:
		return "A"
	case overlay.OpDelete:
		return "D"
	}
	return "M"
}

// WriteSummary prints the plan: totals, every file numbered for selection,
// what the patch could not carry, and then, last, the paths needing
// attention (protected, refused, conflicting, flagged) and the totals again,
// so they stay next to the prompt that follows however long the file list
// is. Every path, reason and explanation is printed through termtext, so no
// name or reason from the guest can drive the terminal.
func WriteSummary(w io.Writer, pl *overlay.Plan, color bool) {
	p := painter(color)
	t := Count(pl)
	fmt.Fprintf(w, "%s %d added, %d modified, %d deleted, %s %s lines\n",
		p.paint(styleBold, "The agent changed:"), t.Added, t.Modified, t.Deleted,
		p.paint(styleGreen, "+"+strconv.Itoa(t.LinesAdded)), p.paint(styleRed, "−"+strconv.Itoa(t.LinesDeleted)))
	if len(pl.Files) > 0 {
		fmt.Fprintf(w, "\n  %s\n", p.paint(styleBold, "Files:"))
	}
	for i, f := range pl.Files {
		stat := ""
		switch {
		case f.Binary:
			stat = "binary"
		case f.Added > 0 || f.Deleted > 0:
			stat = p.paint(styleGreen, "+"+strconv.Itoa(f.Added)) + " " + p.paint(styleRed, "−"+strconv.Itoa(f.Deleted))
		}
		note := ""
		switch f.Status {
		case overlay.StatusApply:
		case overlay.StatusMerged:
			note = " (you changed it too: merged; [r]eview shows the result against your file)"
		case overlay.StatusAlready:
			note = " (already applied)"
		default:
			note = " (" + termtext.Line(string(f.Status)) + ")"
		}
		if flagged(f) {
			note += " " + p.paint(styleYellow, "(flagged)")
		}
		fmt.Fprintf(w, "  %3d  %s  %s  %s%s\n", i+1, opLetter(f.Op), overlay.DisplayPath(f.Path), stat, note)
	}
	if len(pl.NotCarried) > 0 {
		fmt.Fprintf(w, "\n  %s\n", p.paint(styleBold, "Not carried by the patch:"))
		for _, n := range pl.NotCarried {
			fmt.Fprintf(w, "    %s  %s\n", overlay.DisplayPath(n.Path), termtext.Line(n.Reason))
		}
	}
	writeAttention(w, pl, color)
}

// writeAttention prints the paths that need attention, the flagged ones
// (applied by "apply all", and run code on the host) last, then the totals
// on one line: what the user must see just above the prompt.
func writeAttention(w io.Writer, pl *overlay.Plan, color bool) {
	p := painter(color)
	t := Count(pl)
	attentionWhy := false // the flagged list says why each is flagged
	section := func(title, style string, match func(*overlay.PlannedFile) bool) {
		var b strings.Builder
		for i, f := range pl.Files {
			if match(f) {
				why := f.Why
				if attentionWhy && f.AttentionWhy != "" {
					why = f.AttentionWhy // a flagged conflict says both, each in its list
				}
				fmt.Fprintf(&b, "  %3d  %s  %s\n", i+1, overlay.DisplayPath(f.Path), termtext.Inline(why))
			}
		}
		if b.Len() > 0 {
			fmt.Fprintf(w, "\n  %s\n%s", p.paint(style, title), b.String())
		}
	}
	section("Protected — not applied unless you allow them (--allow-protected PATH):", styleRed+styleBold,
		func(f *overlay.PlannedFile) bool { return f.Status == overlay.StatusProtected })
	section("Refused:", styleRed, func(f *overlay.PlannedFile) bool { return f.Status == overlay.StatusRefused })
	section("Merged with your changes — [r]eview shows each merged result against your file as it is now:", styleYellow,
		func(f *overlay.PlannedFile) bool { return f.Status == overlay.StatusMerged })
	section("Conflicts — you changed these too:", styleYellow+styleBold,
		func(f *overlay.PlannedFile) bool { return f.Status == overlay.StatusConflict })
	attentionWhy = true
	section("Flagged — these run code in your tools; look at them:", styleYellow+styleBold, flagged)
	nFlagged := 0
	for _, f := range pl.Files {
		if flagged(f) {
			nFlagged++
		}
	}
	var parts []string
	add := func(n int, text, style string) {
		if n > 0 {
			parts = append(parts, p.paint(style, text))
		}
	}
	add(nFlagged, strconv.Itoa(nFlagged)+" flagged", styleYellow+styleBold)
	add(t.Protected, strconv.Itoa(t.Protected)+" protected", styleRed)
	add(t.Refused, strconv.Itoa(t.Refused)+" refused", styleRed)
	add(t.Conflicts, plural(t.Conflicts, "conflict"), styleYellow)
	add(len(pl.NotCarried), strconv.Itoa(len(pl.NotCarried))+" not carried", "")
	tail := ""
	if len(parts) > 0 {
		tail = "; " + strings.Join(parts, ", ")
	}
	fmt.Fprintf(w, "\n%s %s: %d added, %d modified, %d deleted%s\n", p.paint(styleBold, "In all:"),
		plural(len(pl.Files), "file"), t.Added, t.Modified, t.Deleted, tail)
}

// flagged selects the flagged files that would be applied (a protected or
// refused one is listed under its status).
func flagged(f *overlay.PlannedFile) bool {
	return f.Attention == overlay.AttentionFlagged && f.Status != overlay.StatusProtected && f.Status != overlay.StatusRefused
}

// plural is "1 file", "2 files".
func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return strconv.Itoa(n) + " " + noun + "s"
}

// WriteReport prints what an apply did, path by path.
func WriteReport(w io.Writer, rep *overlay.Report, color bool) {
	p := painter(color)
	for _, f := range rep.Plan.Files {
		res := rep.Results[f.Path]
		style := styleGreen
		switch {
		case strings.HasPrefix(res, "conflict: kept"), strings.HasPrefix(res, "skipped"), strings.HasPrefix(res, "already"):
			style = ""
		case strings.HasPrefix(res, "conflict"):
			style = styleYellow
		case strings.HasPrefix(res, "refused"), strings.HasPrefix(res, "protected"), strings.HasPrefix(res, "failed"):
			style = styleRed
		}
		line := fmt.Sprintf("  %s  %s", overlay.DisplayPath(f.Path), termtext.Inline(res))
		if style != "" {
			line = p.paint(style, line)
		}
		fmt.Fprintln(w, line)
	}
	if rep.BackupID != "" {
		fmt.Fprintf(w, "Backed up what was overwritten; `vibedom undo` puts it back.\n")
	}
}

// ColorDiff renders patch text for a terminal: every character termtext
// does not call safe shown as an escape (\x1b, \u202e …; in reverse video
// with color, so it stands out from the same text typed literally), and with
// color, file headers bold, hunk headers cyan, added lines green, deleted
// lines red.
func ColorDiff(patch []byte, color bool) []byte {
	if !color {
		return termtext.Block(patch)
	}
	patch = termtext.BlockMarked(patch, styleReverse, styleNoReverse)
	var out bytes.Buffer
	out.Grow(len(patch) * 11 / 10)
	for len(patch) > 0 {
		i := bytes.IndexByte(patch, '\n')
		var line []byte
		if i < 0 {
			line, patch = patch, nil
		} else {
			line, patch = patch[:i], patch[i+1:]
		}
		style := ""
		switch {
		case bytes.HasPrefix(line, []byte("diff --git ")), bytes.HasPrefix(line, []byte("--- ")), bytes.HasPrefix(line, []byte("+++ ")),
			bytes.HasPrefix(line, []byte("new file mode")), bytes.HasPrefix(line, []byte("deleted file mode")),
			bytes.HasPrefix(line, []byte("old mode")), bytes.HasPrefix(line, []byte("new mode")), bytes.HasPrefix(line, []byte("index ")):
			style = styleBold
		case bytes.HasPrefix(line, []byte("@@")):
			style = styleCyan
		case bytes.HasPrefix(line, []byte("+")):
			style = styleGreen
		case bytes.HasPrefix(line, []byte("-")):
			style = styleRed
		}
		if style != "" {
			out.WriteString(style)
			out.Write(line)
			out.WriteString(styleReset)
		} else {
			out.Write(line)
		}
		if i >= 0 {
			out.WriteByte('\n')
		}
	}
	return out.Bytes()
}
