package overlay

import "strings"

// Conflict marker labels.
const (
	markerMine   = "<<<<<<< yours (host)"
	markerBase   = "||||||| baseline"
	markerSep    = "======="
	markerTheirs = ">>>>>>> agent"
)

// lineMatches returns, for each line of a, the index of the line of b it is
// matched to by a line diff, or -1.
func lineMatches(a, b []string) []int {
	m := make([]int, len(a))
	for i := range m {
		m[i] = -1
	}
	script := lineDiff(strings.Join(a, ""), strings.Join(b, ""))
	i, j := 0, 0
	for _, l := range script {
		switch l.kind {
		case lineEqual:
			m[i] = j
			i++
			j++
		case lineDelete:
			i++
		case lineInsert:
			j++
		}
	}
	return m
}

// merge3 merges the changes from base to mine and from base to theirs, line
// by line (diff3). It returns the merged text and whether it is clean; with
// conflicts the text holds diff3-style markers.
func merge3(base, mine, theirs string) (string, bool) {
	o, a, b := splitLines(base), splitLines(mine), splitLines(theirs)
	ma, mb := lineMatches(o, a), lineMatches(o, b)
	var out strings.Builder
	clean := true
	write := func(lines []string) {
		for _, l := range lines {
			out.WriteString(l)
		}
	}
	// Markers must start a line, even after a last line without "\n".
	writeBlock := func(lines []string) {
		write(lines)
		if n := len(lines); n > 0 && !strings.HasSuffix(lines[n-1], "\n") {
			out.WriteByte('\n')
		}
	}
	po, ia, ib := 0, 0, 0
	for {
		// Stable run: lines all three agree on, in order.
		k := 0
		for po+k < len(o) && ma[po+k] == ia+k && mb[po+k] == ib+k {
			k++
		}
		if k > 0 {
			write(o[po : po+k])
			po, ia, ib = po+k, ia+k, ib+k
			continue
		}
		// Unstable chunk: up to the next base line matched on both sides.
		j := po
		for j < len(o) && (ma[j] < 0 || mb[j] < 0) {
			j++
		}
		ea, eb := len(a), len(b)
		if j < len(o) {
			ea, eb = ma[j], mb[j]
		}
		co, ca, cb := o[po:j], a[ia:ea], b[ib:eb]
		if len(co) == 0 && len(ca) == 0 && len(cb) == 0 {
			break
		}
		switch {
		case equalLines(ca, co):
			write(cb)
		case equalLines(cb, co), equalLines(ca, cb):
			write(ca)
		default:
			clean = false
			out.WriteString(markerMine + "\n")
			writeBlock(ca)
			out.WriteString(markerBase + "\n")
			writeBlock(co)
			out.WriteString(markerSep + "\n")
			writeBlock(cb)
			out.WriteString(markerTheirs + "\n")
		}
		po, ia, ib = j, ea, eb
	}
	return out.String(), clean
}

func equalLines(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
