package dlp

import (
	"encoding/binary"
	"math/rand/v2"
	"testing"
)

// TestDigitMask checks the word-at-a-time digit test against a byte loop,
// on random words and words of printable ASCII around the digits.
func TestDigitMask(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(5, 6))
	for it := 0; it < 2000000; it++ {
		var b [8]byte
		for i := range b {
			b[i] = byte(r.IntN(256))
			if it%3 == 0 {
				b[i] = byte(0x20 + r.IntN(0x20))
			}
		}
		var want uint64
		for i, c := range b {
			if c >= '0' && c <= '9' {
				want |= 0x80 << (8 * i)
			}
		}
		if got := digitMask(binary.LittleEndian.Uint64(b[:])); got != want {
			t.Fatalf("%q: got %x, want %x", b, got, want)
		}
	}
}
