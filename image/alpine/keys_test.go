package alpine

import (
	"crypto/sha256"
	"encoding/hex"
	"testing"
)

// TestReleaseKeysPinned fails when an embedded key changes, appears or
// goes: a change of trust must be a deliberate edit of this table.
func TestReleaseKeysPinned(t *testing.T) {
	t.Parallel()
	want := map[string]string{
		"alpine-devel@lists.alpinelinux.org-616ae350.rsa.pub": "d11f6b21c61b4274e182eb888883a8ba8acdbf820dcc7a6d82a7d9fc2fd2836d",
		"alpine-devel@lists.alpinelinux.org-6165ee59.rsa.pub": "207e4696d3c05f7cb05966aee557307151f1f00217af4143c1bcaf33b8df733f",
	}
	ents, err := releaseKeyFiles.ReadDir("keys")
	if err != nil {
		t.Fatal(err)
	}
	if len(ents) != len(want) {
		t.Fatalf("%d embedded keys, want %d", len(ents), len(want))
	}
	for _, e := range ents {
		b, _ := releaseKeyFiles.ReadFile("keys/" + e.Name())
		s := sha256.Sum256(b)
		if got := hex.EncodeToString(s[:]); got != want[e.Name()] {
			t.Errorf("key %s: sha256 %s, want %s", e.Name(), got, want[e.Name()])
		}
	}
	if got := ReleaseKeys().Names(); len(got) != len(want) {
		t.Errorf("ReleaseKeys has %v", got)
	}
}
