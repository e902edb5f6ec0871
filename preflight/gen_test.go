package preflight

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// genTree writes n source-like files (no secrets) under dir, 100 a folder,
// deterministic for a seed. Sizes vary from ~200 bytes to ~4 KB.
func genTree(tb testing.TB, dir string, n int, seed uint64) {
	tb.Helper()
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	words := []string{"func", "return", "value", "config", "handler", "request", "token", "client",
		"server", "user", "name", "index", "buffer", "result", "error", "context", "key", "cache",
		"password", "limit", "offset", "status", "message", "payload", "session", "retry"}
	exts := []string{".go", ".py", ".ts", ".md", ".yaml", ".json", ".txt", ".rb"}
	var b strings.Builder
	for i := range n {
		sub := filepath.Join(dir, fmt.Sprintf("pkg%03d", i/100), fmt.Sprintf("mod%d", (i/10)%10))
		if i%10 == 0 {
			if err := os.MkdirAll(sub, 0o755); err != nil {
				tb.Fatal(err)
			}
		}
		b.Reset()
		lines := 5 + rng.IntN(80)
		for l := range lines {
			fmt.Fprintf(&b, "%s%s := %s(%s, %d) // %s %s\n", strings.Repeat("\t", l%3),
				words[rng.IntN(len(words))], words[rng.IntN(len(words))], words[rng.IntN(len(words))],
				rng.IntN(100000), words[rng.IntN(len(words))], words[rng.IntN(len(words))])
		}
		name := filepath.Join(sub, fmt.Sprintf("file%05d%s", i, exts[i%len(exts)]))
		if err := os.WriteFile(name, []byte(b.String()), 0o644); err != nil {
			tb.Fatal(err)
		}
	}
}
