package review

import (
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/vibedom/vibedom/overlay"
)

// statFile is one path of a patch for WriteStat: a type change (two
// entries) counts once.
type statFile struct {
	path           string
	added, deleted int
	binary         bool
}

func statFiles(fps []*overlay.FilePatch) []statFile {
	var out []statFile
	at := map[string]int{}
	for _, fp := range fps {
		i, ok := at[fp.Path]
		if !ok {
			i = len(out)
			at[fp.Path] = i
			out = append(out, statFile{path: fp.Path})
		}
		out[i].added += fp.Added
		out[i].deleted += fp.Deleted
		out[i].binary = out[i].binary || fp.Binary
	}
	slices.SortFunc(out, func(a, b statFile) int { return strings.Compare(a.path, b.path) })
	return out
}

// WriteNameOnly prints the path of every file the patch changes, one a
// line, sorted, each through the one sanitizer.
func WriteNameOnly(w io.Writer, fps []*overlay.FilePatch) {
	for _, f := range statFiles(fps) {
		fmt.Fprintln(w, overlay.DisplayPath(f.path))
	}
}

// WriteStat prints a diffstat of the patch as `git diff --stat` does: one
// line per path with its count of changed lines and a bar of + and -
// (scaled to fit 80 columns), "Bin" for binary files, then the totals.
// Names go through the one sanitizer.
func WriteStat(w io.Writer, fps []*overlay.FilePatch, color bool) {
	p := painter(color)
	files := statFiles(fps)
	nameW, numW, most := 0, 1, 0
	var adds, dels int
	for _, f := range files {
		nameW = max(nameW, utf8.RuneCountInString(overlay.DisplayPath(f.path)))
		n := f.added + f.deleted
		numW = max(numW, len(strconv.Itoa(n)))
		most = max(most, n)
		adds += f.added
		dels += f.deleted
	}
	nameW = min(nameW, 50)
	barW := max(80-nameW-numW-6, 10)
	for _, f := range files {
		name := overlay.DisplayPath(f.path)
		if r := []rune(name); len(r) > nameW {
			name = "..." + string(r[len(r)-nameW+3:])
		}
		pad := strings.Repeat(" ", nameW-utf8.RuneCountInString(name))
		if f.binary {
			fmt.Fprintf(w, " %s%s | %*s\n", name, pad, numW, "Bin")
			continue
		}
		n := f.added + f.deleted
		plus, minus := f.added, f.deleted
		if most > barW {
			plus, minus = scale(f.added, most, barW), scale(f.deleted, most, barW)
		}
		bar := ""
		if n > 0 {
			bar = " " + p.paint(styleGreen, strings.Repeat("+", plus)) + p.paint(styleRed, strings.Repeat("-", minus))
		}
		fmt.Fprintf(w, " %s%s | %*d%s\n", name, pad, numW, n, bar)
	}
	fmt.Fprintf(w, " %s changed", plural(len(files), "file"))
	if adds > 0 || dels == 0 {
		fmt.Fprintf(w, ", %d insertion%s(+)", adds, map[bool]string{true: "s"}[adds != 1])
	}
	if dels > 0 || adds == 0 {
		fmt.Fprintf(w, ", %d deletion%s(-)", dels, map[bool]string{true: "s"}[dels != 1])
	}
	fmt.Fprintln(w)
}

// scale maps n of most onto width columns, at least one for any n > 0.
func scale(n, most, width int) int {
	if n == 0 {
		return 0
	}
	return max(1, n*width/most)
}
