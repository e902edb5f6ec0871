package session

import (
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vibedom/vibedom/home"
)

func writeSession(t *testing.T, h home.Home, name string, st map[string]any) {
	t.Helper()
	dir := h.Session(name)
	os.MkdirAll(dir, 0o700)
	b, _ := json.Marshal(st)
	if err := os.WriteFile(filepath.Join(dir, stateFile), b, 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestSessionStore(t *testing.T) {
	t.Parallel()
	h := home.Home(t.TempDir())
	if _, err := FindSession(h, ""); !errors.Is(err, ErrNoSession) {
		t.Errorf("empty home: %v", err)
	}
	day := func(d int) time.Time { return time.Date(2026, 1, d, 0, 0, 0, 0, time.UTC) }
	// A dead process: run one and wait for it.
	dead := exec.Command("true")
	dead.Run()
	self := os.Getpid()
	writeSession(t, h, "done-1", map[string]any{"name": "done-1", "workspace": "/w/a", "created": day(1), "status": "stopped"})
	writeSession(t, h, "crashed-2", map[string]any{"name": "crashed-2", "workspace": "/w/b", "created": day(2), "status": "running", "pid": dead.Process.Pid})
	writeSession(t, h, "live-3", map[string]any{"name": "live-3", "workspace": "/w/c", "created": day(3), "status": "running", "pid": self, "pid_start": procStart(self)})
	writeSession(t, h, "recycled-4", map[string]any{"name": "recycled-4", "workspace": "/w/d", "created": day(4), "status": "running", "pid": self, "pid_start": "1"})
	writeSession(t, h, "relative-5", map[string]any{"name": "relative-5", "workspace": "rel/ws", "created": day(5), "status": "stopped"})
	os.MkdirAll(h.Session("corrupt-6"), 0o700)
	os.WriteFile(filepath.Join(h.Session("corrupt-6"), stateFile), []byte("{not json"), 0o600)
	os.MkdirAll(h.Session("nostate"), 0o700)

	all, err := ListSessions(h)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]Status{}
	var order []string
	for _, i := range all {
		got[i.Name] = i.Live
		order = append(order, i.Name)
	}
	want := map[string]Status{"done-1": StatusStopped, "crashed-2": StatusCrashed, "live-3": StatusRunning,
		"recycled-4": StatusCrashed, "relative-5": StatusDamaged, "corrupt-6": StatusDamaged}
	for n, s := range want {
		if got[n] != s {
			t.Errorf("%s: %s, want %s", n, got[n], s)
		}
	}
	if _, ok := got["nostate"]; ok {
		t.Error("a folder without state.json is listed")
	}
	// Newest first; a state that does not parse has no date and comes last.
	if order[0] != "relative-5" || order[len(order)-2] != "done-1" || order[len(order)-1] != "corrupt-6" {
		t.Errorf("not newest first: %v", order)
	}
	// The newest usable session.
	if i, err := FindSession(h, ""); err != nil || i.Name != "recycled-4" {
		t.Errorf("latest: %v %v", i, err)
	}
	if _, err := FindSession(h, "corrupt-6"); err == nil || !strings.Contains(err.Error(), "damaged") {
		t.Errorf("corrupt: %v", err)
	}
	for _, bad := range []string{"../x", ".", "..", "a/b", "A\x1b[31m", strings.Repeat("x", 80)} {
		if _, err := FindSession(h, bad); !errors.Is(err, ErrNoSession) {
			t.Errorf("%q: %v", bad, err)
		}
	}
	if _, err := FindSession(h, "missing"); !errors.Is(err, ErrNoSession) || !strings.Contains(err.Error(), "vibedom list") {
		t.Errorf("missing: %v", err)
	}
}
