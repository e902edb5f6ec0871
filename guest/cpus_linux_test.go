package guest

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
)

func TestOnlineCPUs(t *testing.T) {
	root := t.TempDir()
	state := map[string]string{"cpu0": "", "cpu1": "0\n", "cpu2": "1\n", "cpu3": "0\n"}
	for cpu, online := range state {
		dir := filepath.Join(root, cpu)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if online == "" {
			continue // cpu0 has no online file on x86
		}
		if err := os.WriteFile(filepath.Join(dir, "online"), []byte(online), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// Not a CPU: never written.
	if err := os.MkdirAll(filepath.Join(root, "cpufreq"), 0o755); err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if n := onlineCPUs(log, root); n != 2 {
		t.Errorf("brought %d CPUs online, want 2", n)
	}
	for cpu, want := range map[string]string{"cpu1": "1", "cpu2": "1\n", "cpu3": "1"} {
		got, _ := os.ReadFile(filepath.Join(root, cpu, "online"))
		if string(got) != want {
			t.Errorf("%s/online = %q, want %q", cpu, got, want)
		}
	}
	if n := onlineCPUs(log, root); n != 0 {
		t.Errorf("second call brought %d CPUs online, want 0", n)
	}
}
