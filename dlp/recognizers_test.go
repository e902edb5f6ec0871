package dlp

import (
	"encoding/binary"
	"strings"
	"testing"
)

// TestRecognizerTable checks the table the anchor index is built from,
// and that checkRecognizers refuses the rows that could not work.
func TestRecognizerTable(t *testing.T) {
	if err := checkRecognizers(recognizers); err != nil {
		t.Fatalf("the recognizer table: %v", err)
	}
	ok := recognizer{name: "x", cat: CatToken, anchors: lits(0, 0, "xyz_tok"), check: prefixed(cAlnum, 8)}
	tests := []struct {
		name string
		edit func(r *recognizer)
		want string
	}{
		{"no name", func(r *recognizer) { r.name = "" }, "duplicate name"},
		{"known-value category", func(r *recognizer) { r.cat = CatSecret }, "not a recognizer's"},
		{"unknown category", func(r *recognizer) { r.cat = numCategories }, "not a recognizer's"},
		{"no anchors", func(r *recognizer) { r.anchors = nil }, "no anchors"},
		{"no check", func(r *recognizer) { r.check = nil }, "no check"},
		{"views", func(r *recognizer) { r.views = []viewKind{viewJSON} }, "views"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := ok
			tt.edit(&r)
			err := checkRecognizers([]recognizer{r})
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("checkRecognizers = %v, want an error about %q", err, tt.want)
			}
		})
	}
	t.Run("duplicate name", func(t *testing.T) {
		if err := checkRecognizers([]recognizer{ok, ok}); err == nil {
			t.Fatal("checkRecognizers accepted a name used twice")
		}
	})
}

// TestRecognizerAnchorsIndexed checks that every literal of every row
// is found by the anchor index at every alignment.
func TestRecognizerAnchorsIndexed(t *testing.T) {
	x := anchorsOnce()
	for _, rec := range recognizers {
		for _, a := range rec.anchors {
			for pad := 0; pad < 2; pad++ {
				text := []byte(strings.Repeat(" ", pad) + a.lit + "Zx8Qm2Lk7Vn4Tp9W")
				found := false
				for i := 0; i+4 <= len(text); i += 2 {
					for _, r := range x.byKey[binary.LittleEndian.Uint32(text[i:])] {
						if r.def.rec.name == rec.name && r.def.lit == a.lit && i-r.off == pad {
							found = true
						}
					}
				}
				if !found {
					t.Errorf("%s: anchor %q at offset %d is not found", rec.name, a.lit, pad)
				}
			}
		}
	}
}
