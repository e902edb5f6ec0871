package agents_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vibedom/vibedom/agents"
	"github.com/vibedom/vibedom/agents/agentstest"
	"github.com/vibedom/vibedom/progress"
)

// The smallest real agent package, packed by npm, served by a local
// registry and installed with its compiled-in pin.
func TestInstallRealPackage(t *testing.T) {
	t.Parallel()
	p, reg := agentstest.ServeSmallest(t)
	home := t.TempDir()
	var out bytes.Buffer
	res, err := agents.Install(t.Context(), agents.Options{Home: home, Registry: reg.URL, Progress: progress.NewText(&out, false)}, []agents.Pin{p})
	if err != nil {
		t.Fatal(err)
	}
	i := res[0].Installed
	f, err := os.Open(i.BinaryPath())
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	var head [4]byte
	io.ReadFull(f, head[:])
	f.Seek(0, 0)
	n, _ := io.Copy(h, f)
	if string(head[:]) != "\x7fELF" || n != i.BinarySize || hex.EncodeToString(h.Sum(nil)) != i.BinarySHA256 {
		t.Errorf("binary %s: head %q, %d bytes", i.BinaryPath(), head, n)
	}
	if !strings.Contains(out.String(), p.String()) {
		t.Errorf("progress: %q", out.String())
	}
	found, err := agents.FindAgent(home, p.Agent, p.Arch, agents.LibcMusl)
	if err != nil || found.BinaryPath() != i.BinaryPath() {
		t.Errorf("FindAgent: %v %v", found, err)
	}
}

// Every real tarball already packed into .cache/npm installs with its pin
// (the binary path in the table is right); none is fetched for this.
func TestInstallPackedPackages(t *testing.T) {
	t.Parallel()
	if os.Getenv("VIBEDOM_TEST_ALL_AGENTS") == "" {
		t.Skip("set VIBEDOM_TEST_ALL_AGENTS=1 to unpack every agent packed in .cache/npm (~16 s for three)")
	}
	dir := agentstest.PackDir()
	files := map[agents.Pin]string{}
	for _, p := range agents.Pins {
		path := filepath.Join(dir, agents.TarballName(p))
		if st, err := os.Stat(path); dir != "" && err == nil && st.Size() == p.Size {
			files[p] = path
		}
	}
	if len(files) == 0 {
		t.Skip("no agent tarballs packed in .cache/npm")
	}
	reg := agentstest.Serve(t, files)
	for p := range files {
		t.Run(p.Dir(), func(t *testing.T) {
			res, err := agents.Install(t.Context(), agents.Options{Home: t.TempDir(), Registry: reg.URL}, []agents.Pin{p})
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%s: %s, %d bytes", p, res[0].Binary, res[0].BinarySize)
		})
	}
}
