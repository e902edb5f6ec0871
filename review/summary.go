package review

import (
	"bytes"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/vibedom/vibedom/overlay"
)

// ANSI styles.
const (
	styleReset  = "\x1b[0m"
	styleBold   = "\x1b[1m"
	styleRed    = "\x1b[31m"
	styleGreen  = "\x1b[32m"
	styleYellow = "\x1b[33m"
	styleCyan   = "\x1b[36m"
)

type painter bool

func (p painter) paint(style, s string) string {
	if !p {
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

// WriteSummary prints the plan: totals, then protected, refused, conflicting
// and flagged paths (the ones needing attention), then every file numbered
// for selection, then what the patch could not carry. Paths are printed
// escaped (DisplayPath), so a file name cannot drive the terminal.
func WriteSummary(w io.Writer, pl *overlay.Plan, color bool) {
	p := painter(color)
	t := Count(pl)
	fmt.Fprintf(w, "%s %d added, %d modified, %d deleted, %s %s lines\n",
		p.paint(styleBold, "The agent changed:"), t.Added, t.Modified, t.Deleted,
		p.paint(styleGreen, "+"+strconv.Itoa(t.LinesAdded)), p.paint(styleRed, "−"+strconv.Itoa(t.LinesDeleted)))
	section := func(title, style string, match func(*overlay.PlannedFile) bool) {
		var b strings.Builder
		for _, f := range pl.Files {
			if match(f) {
				fmt.Fprintf(&b, "    %s  %s\n", overlay.DisplayPath(f.Path), f.Why)
			}
		}
		if b.Len() > 0 {
			fmt.Fprintf(w, "\n  %s\n%s", p.paint(style, title), b.String())
		}
	}
	section("Protected — not applied unless you allow them (--allow-protected PATH):", styleRed+styleBold,
		func(f *overlay.PlannedFile) bool { return f.Status == overlay.StatusProtected })
	section("Refused:", styleRed, func(f *overlay.PlannedFile) bool { return f.Status == overlay.StatusRefused })
	section("Conflicts — you changed these too:", styleYellow+styleBold,
		func(f *overlay.PlannedFile) bool { return f.Status == overlay.StatusConflict })
	section("Flagged — these run code in your tools; look at them:", styleYellow, func(f *overlay.PlannedFile) bool {
		return f.Attention == overlay.AttentionFlagged && f.Status != overlay.StatusProtected && f.Status != overlay.StatusRefused
	})
	fmt.Fprintf(w, "\n  %s\n", p.paint(styleBold, "Files:"))
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
			note = " (you changed it too: merges cleanly)"
		case overlay.StatusAlready:
			note = " (already applied)"
		default:
			note = " (" + string(f.Status) + ")"
		}
		fmt.Fprintf(w, "  %3d  %s  %s  %s%s\n", i+1, opLetter(f.Op), overlay.DisplayPath(f.Path), stat, note)
	}
	if len(pl.NotCarried) > 0 {
		fmt.Fprintf(w, "\n  %s\n", p.paint(styleBold, "Not carried by the patch:"))
		for _, n := range pl.NotCarried {
			fmt.Fprintf(w, "    %s  %s\n", overlay.DisplayPath(n.Path), n.Reason)
		}
	}
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
		line := fmt.Sprintf("  %s  %s", overlay.DisplayPath(f.Path), res)
		if style != "" {
			line = p.paint(style, line)
		}
		fmt.Fprintln(w, line)
	}
	if rep.BackupID != "" {
		fmt.Fprintf(w, "Backed up what was overwritten; `vibedom undo` puts it back.\n")
	}
}

// sanitize makes agent-controlled text safe for a terminal: control bytes
// other than tab and newline become visible (^[, ^H …), so a file's content
// cannot move the cursor, recolor the screen or retitle the window.
func sanitize(b []byte) []byte {
	clean := true
	for _, c := range b {
		if (c < 0x20 && c != '\t' && c != '\n') || c == 0x7f {
			clean = false
			break
		}
	}
	if clean {
		return b
	}
	var out bytes.Buffer
	out.Grow(len(b) + 16)
	for _, c := range b {
		switch {
		case c == 0x7f:
			out.WriteString("^?")
		case c < 0x20 && c != '\t' && c != '\n':
			out.WriteByte('^')
			out.WriteByte(c + '@')
		default:
			out.WriteByte(c)
		}
	}
	return out.Bytes()
}

// ColorDiff renders patch text for a terminal: control characters made
// visible, and with color, file headers bold, hunk headers cyan, added lines
// green, deleted lines red.
func ColorDiff(patch []byte, color bool) []byte {
	patch = sanitize(patch)
	if !color {
		return patch
	}
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
