package dlp

import (
	"encoding/binary"
	"fmt"
	"slices"
)

// anchorDef is one literal registered in the anchor index: an anchor of
// a recognizer row, and the row.
type anchorDef struct {
	anchor
	rec *recognizer
}

// anchorIndex tests the 4-byte window at every second position against a
// bitmap of the anchor keys (independent tests, nothing carried from byte
// to byte); the rare hits look the key up and compare the literal.
type anchorIndex struct {
	bitmap [1 << anchorBits / 64]uint64
	// byKey lists the refs of each key while the index is built (nil
	// after); table holds the same for the scan, without a map's
	// hashing and indirections.
	byKey map[uint32][]anchorRef
	table keyTable
	// cats are the categories of the rows (the pass is skipped when the
	// policy acts on none of them).
	cats []Category
}

type anchorRef struct {
	def *anchorDef
	off int // of the key in the literal
}

const anchorMul = 0x9E3779B1

// anchorBits sizes the anchor bitmap: 2^20 bits (128 KiB) keep false
// hits near 1 % for the ~1,100 keys of vibedom's anchors and the ~10,000
// of gitleaks' keywords.
const anchorBits = 20

func anchorHash(key uint32) uint32 { return (key * anchorMul) >> (32 - anchorBits) }

func fold(c byte) byte {
	if c >= 'A' && c <= 'Z' {
		return c + 'a' - 'A'
	}
	return c
}

// variants lists s in every combination of letter cases.
func variants(s string) []string {
	out := []string{""}
	for i := 0; i < len(s); i++ {
		c := s[i]
		lo, up := fold(c), c
		if c >= 'a' && c <= 'z' {
			up = c - 'a' + 'A'
		}
		var next []string
		for _, p := range out {
			next = append(next, p+string(lo))
			if up != lo {
				next = append(next, p+string(up))
			}
		}
		out = next
	}
	return out
}

// newAnchorIndex derives the anchor index from the recognizer table.
func newAnchorIndex() *anchorIndex {
	if err := checkRecognizers(recognizers); err != nil {
		panic(err)
	}
	x := &anchorIndex{byKey: map[uint32][]anchorRef{}}
	for i := range recognizers {
		rec := &recognizers[i]
		if !slices.Contains(x.cats, rec.cat) {
			x.cats = append(x.cats, rec.cat)
		}
		for _, a := range rec.anchors {
			x.registerAnchor(&anchorDef{a, rec})
		}
		if rec.keywords != nil {
			for _, kw := range rec.keywords() {
				d := &anchorDef{anchor{lit: kw, ci: true}, rec}
				for k, off := range glKeys(kw) {
					x.register(k, anchorRef{d, off})
				}
			}
		}
	}
	x.table = newKeyTable(x.byKey)
	x.byKey = nil
	return x
}

// keyTable maps a 4-byte key to its refs: open addressing over a power
// of two of slots (at most half used), each slot a key and its run of
// refs in one array (one cache line read for a key).
type keyTable struct {
	slots []keySlot
	refs  []anchorRef
	shift uint
}

// keySlot is refs[start:end] for key; end == start: empty.
type keySlot struct {
	key        uint32
	start, end int32
}

func newKeyTable(m map[uint32][]anchorRef) keyTable {
	bits := uint(4)
	for 1<<bits < 2*len(m) {
		bits++
	}
	t := keyTable{slots: make([]keySlot, 1<<bits), shift: 32 - bits}
	keys := make([]uint32, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys) // the same layout every run
	for _, k := range keys {
		i := t.slot(k)
		for t.slots[i].end != t.slots[i].start {
			i = (i + 1) & (len(t.slots) - 1)
		}
		s := int32(len(t.refs))
		t.refs = append(t.refs, m[k]...)
		t.slots[i] = keySlot{k, s, int32(len(t.refs))}
	}
	return t
}

func (t *keyTable) slot(k uint32) int { return int((k * anchorMul) >> t.shift) }

// lookup returns the refs of key k (none when it is not an anchor key).
func (t *keyTable) lookup(k uint32) []anchorRef {
	mask := len(t.slots) - 1
	for i := t.slot(k); ; i = (i + 1) & mask {
		sl := &t.slots[i]
		if sl.start == sl.end {
			return nil
		}
		if sl.key == k {
			return t.refs[sl.start:sl.end]
		}
	}
}

// registerAnchor registers the keys of d's literal at d.off and d.off+1.
func (x *anchorIndex) registerAnchor(d *anchorDef) {
	for _, off := range []int{d.off, d.off + 1} {
		var keys []string
		if off+4 <= len(d.lit) {
			keys = []string{d.lit[off : off+4]}
		} else if off+3 == len(d.lit) && d.next != 0 {
			for c := 0; c < 256; c++ {
				if class[c]&d.next != 0 {
					keys = append(keys, d.lit[off:]+string(rune(c)))
				}
			}
		} else {
			panic("dlp: anchor " + d.lit + " of recognizer " + d.rec.name + " has no key at offset " + fmt.Sprint(off))
		}
		if d.ci {
			var all []string
			for _, k := range keys {
				all = append(all, variants(k)...)
			}
			keys = all
		}
		for _, k := range keys {
			x.register(k, anchorRef{d, off})
		}
	}
}

func (x *anchorIndex) register(k string, r anchorRef) {
	key := binary.LittleEndian.Uint32([]byte(k))
	h := anchorHash(key)
	x.bitmap[h>>6] |= 1 << (h & 63)
	x.byKey[key] = append(x.byKey[key], r)
}

// matchLit reports whether d's literal starts at buf[i].
func matchLit(buf []byte, i int, d *anchorDef) bool {
	if i < 0 || i+len(d.lit) > len(buf) {
		return false
	}
	if !d.ci {
		return string(buf[i:i+len(d.lit)]) == d.lit
	}
	for k := 0; k < len(d.lit); k++ {
		if fold(buf[i+k]) != fold(d.lit[k]) {
			return false
		}
	}
	return true
}
