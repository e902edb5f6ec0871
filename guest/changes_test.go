//go:build linux

package guest

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/vibedom/vibedom/guest/proto"
	"github.com/vibedom/vibedom/overlay"
)

// TestWriteCollection: the stream carries the change set and every changed
// file whole, larger than any one read or frame buffer, in path order;
// files over the limit are listed only.
func TestWriteCollection(t *testing.T) {
	lower, upper := t.TempDir(), t.TempDir()
	rng := rand.New(rand.NewPCG(1, 2))
	content := map[string][]byte{}
	for name, size := range map[string]int{"big.bin": 3<<20 + 7, "a/small.txt": 5, "empty": 0, "over.bin": 4<<20 + 1} {
		b := make([]byte, size)
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
		p := filepath.Join(upper, filepath.FromSlash(name))
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		content[name] = b
	}
	var out bytes.Buffer
	if err := writeCollection(&out, lower, upper, 4<<20); err != nil {
		t.Fatal(err)
	}
	cr, err := proto.NewCollectReader(&out, proto.CollectLimits{MaxPath: overlay.MaxPathLen, MaxChangeSet: 1 << 20, MaxFile: 4 << 20})
	if err != nil {
		t.Fatal(err)
	}
	f, err := cr.Next()
	if err != nil || f.Kind != proto.FrameChangeSet {
		t.Fatalf("first frame %+v, %v", f, err)
	}
	data, err := io.ReadAll(cr.Body())
	if err != nil {
		t.Fatal(err)
	}
	var cs overlay.ChangeSet
	if err := json.Unmarshal(data, &cs); err != nil {
		t.Fatal(err)
	}
	var got []string
	for {
		f, err := cr.Next()
		if err != nil {
			t.Fatal(err)
		}
		if f.Kind == proto.FrameEnd {
			break
		}
		body, err := io.ReadAll(cr.Body())
		if err != nil {
			t.Fatalf("%s: %v", f.Path, err)
		}
		if !bytes.Equal(body, content[f.Path]) {
			t.Errorf("%s: %d bytes sent, want %d", f.Path, len(body), len(content[f.Path]))
		}
		got = append(got, f.Path)
	}
	if err := cr.End(); err != nil {
		t.Error(err)
	}
	want := []string{"a/small.txt", "big.bin", "empty"}
	if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] || got[2] != want[2] {
		t.Errorf("files sent %v, want %v (over.bin listed only)", got, want)
	}
	for _, c := range cs.Changes {
		if c.Path == "over.bin" {
			sum := sha256.Sum256(content["over.bin"])
			if c.SHA256 != hex.EncodeToString(sum[:]) {
				t.Errorf("over.bin listed with a wrong hash")
			}
		}
	}
}
