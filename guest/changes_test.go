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
	t.Parallel()
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
	// A modified file whose copy-up base the guest recorded: the stream's
	// change set carries the base.
	if err := os.WriteFile(filepath.Join(lower, "mod.txt"), []byte("host now\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(upper, "mod.txt"), []byte("agent\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	content["mod.txt"] = []byte("agent\n")
	baseSum := sha256.Sum256([]byte("copied up\n"))
	bases := map[string]overlay.Base{"mod.txt": {SHA256: hex.EncodeToString(baseSum[:]), Mode: 0o644}}
	var out bytes.Buffer
	if err := writeCollection(&out, nil, lower, upper, bases, 4<<20); err != nil {
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
	want := []string{"a/small.txt", "big.bin", "empty", "mod.txt"}
	if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] || got[2] != want[2] || got[3] != want[3] {
		t.Errorf("files sent %v, want %v (over.bin listed only)", got, want)
	}
	for _, c := range cs.Changes {
		if c.Path == "mod.txt" && c.BaseSHA256 != hex.EncodeToString(baseSum[:]) {
			t.Errorf("mod.txt carries base %q, want the recorded one", c.BaseSHA256)
		}
		if c.Path == "over.bin" {
			sum := sha256.Sum256(content["over.bin"])
			if c.SHA256 != hex.EncodeToString(sum[:]) {
				t.Errorf("over.bin listed with a wrong hash")
			}
		}
	}
}
