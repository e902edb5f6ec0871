package dlp

import (
	"encoding/binary"
	"math/rand/v2"
	"testing"
)

func TestHasDigitExhaustiveBytes(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for it := 0; it < 2000000; it++ {
		var b [8]byte
		for i := range b {
			b[i] = byte(r.IntN(256))
			if it%3 == 0 {
				b[i] = byte(0x20 + r.IntN(0x20))
			}
		}
		want := false
		for _, c := range b {
			if c >= '0' && c <= '9' {
				want = true
			}
		}
		if got := hasDigit(binary.LittleEndian.Uint64(b[:])); got != want {
			t.Fatalf("%q: got %v", b, got)
		}
	}
}
