package fence

import (
	"bufio"
	"os"
	"slices"
	"strings"
	"testing"
)

// docTable reads the package table of docs/architecture.md: every row whose
// first cell is a `package`, its third cell the packages it may import
// (`*` for anything, — for none).
func docTable(t *testing.T) map[string][]string {
	t.Helper()
	f, err := os.Open("../../docs/architecture.md")
	if err != nil {
		t.Fatalf("the project's map: %v", err)
	}
	defer f.Close()
	out := map[string][]string{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if !strings.HasPrefix(line, "| `") {
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), "|")
		if len(cells) != 3 {
			continue // another table (the one of where things go)
		}
		room := strings.Trim(strings.TrimSpace(cells[0]), "`")
		var may []string
		for _, c := range strings.Split(cells[2], ",") {
			c = strings.Trim(strings.TrimSpace(c), "`")
			switch c {
			case "", "—":
			case "*":
				may = append(may, anything)
			default:
				may = append(may, c)
			}
		}
		if _, dup := out[room]; dup {
			t.Errorf("docs/architecture.md lists %s twice", room)
		}
		out[room] = may
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestArchitectureDoc: docs/architecture.md's package table and the fence's
// table say the same thing, room by room and arrow by arrow.
func TestArchitectureDoc(t *testing.T) {
	doc := docTable(t)
	if len(doc) == 0 {
		t.Fatal("no package table found in docs/architecture.md")
	}
	for room, may := range table {
		d, ok := doc[room]
		if !ok {
			t.Errorf("%s is in the fence table but not in docs/architecture.md", room)
			continue
		}
		a, b := slices.Sorted(slices.Values(may)), slices.Sorted(slices.Values(d))
		if !slices.Equal(a, b) {
			t.Errorf("%s may import %v in the fence table, %v in docs/architecture.md", room, a, b)
		}
	}
	for room := range doc {
		if _, ok := table[room]; !ok {
			t.Errorf("%s is in docs/architecture.md but not in the fence table", room)
		}
	}
}
