package dlp

import (
	"encoding/binary"
	"math/rand/v2"
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
					for _, r := range x.table.lookup(binary.LittleEndian.Uint32(text[i:])) {
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

// TestKeyTable checks the anchor keys' table against the map it is built
// from: every key gives its refs in order, other keys none, also where
// keys collide on a slot.
func TestKeyTable(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	defs := make([]anchorDef, 8)
	m := map[uint32][]anchorRef{}
	for len(m) < 3000 {
		k := r.Uint32()
		if r.IntN(4) == 0 {
			k &= 0xFF // many keys in few slots' neighbourhoods
		}
		for range 1 + r.IntN(3) {
			m[k] = append(m[k], anchorRef{&defs[r.IntN(len(defs))], r.IntN(4)})
		}
	}
	tab := newKeyTable(m)
	for k, want := range m {
		got := tab.lookup(k)
		if len(got) != len(want) {
			t.Fatalf("key %#x: %d refs, want %d", k, len(got), len(want))
		}
		for i := range got {
			if got[i] != want[i] {
				t.Fatalf("key %#x: ref %d differs", k, i)
			}
		}
	}
	for range 100000 {
		if k := r.Uint32(); m[k] == nil && tab.lookup(k) != nil {
			t.Fatalf("key %#x is not in the map but has refs", k)
		}
	}
	if empty := newKeyTable(nil); empty.lookup(7) != nil {
		t.Fatal("an empty table has refs")
	}
}
