package session

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vibedom/vibedom/home"
	"github.com/vibedom/vibedom/vm"
)

// unavailableDriver is a driver that can start nothing: a recovery with it
// stops before it boots.
type unavailableDriver struct{}

var _ vm.Driver = unavailableDriver{}

func (unavailableDriver) Name() string  { return "none" }
func (unavailableDriver) Info() vm.Info { return vm.Info{} }
func (unavailableDriver) Available(context.Context, vm.Arch) error {
	return errors.New("no hypervisor in this test")
}
func (unavailableDriver) Start(context.Context, vm.Config) (vm.Machine, error) {
	return nil, errors.New("no hypervisor in this test")
}

// TestRecoverRemovesOnlyItsRuntimeFolder: recover clears the dead host's
// runtime folder, named by state.json's control socket. A control path that
// names any other folder whose name starts with "vibedom-" (a project
// folder, say) must not be removed.
func TestRecoverRemovesOnlyItsRuntimeFolder(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	hm := home.Home(filepath.Join(root, "hm"))
	ws := filepath.Join(root, "ws")
	victim := filepath.Join(root, "code", "vibedom-website")
	dir := hm.Session("ws-0001")
	for _, d := range []string{ws, victim, dir, filepath.Join(root, "logs")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(victim, "index.html"), []byte("the user's work\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, scratchFile), []byte("disk"), 0o600); err != nil {
		t.Fatal(err)
	}
	st, _ := json.Marshal(State{Name: "ws-0001", Workspace: ws, Created: time.Now().UTC(), Status: StatusRunning,
		LogDir: filepath.Join(hm.Logs(), "session-1"), PID: 0, Control: filepath.Join(victim, controlSocket)})
	if err := os.WriteFile(filepath.Join(dir, stateFile), st, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Recover(t.Context(), RecoverOptions{Home: hm, Name: "ws-0001", Driver: unavailableDriver{}}); err == nil {
		t.Fatal("a recovery without a hypervisor succeeded")
	}
	if _, err := os.Stat(filepath.Join(victim, "index.html")); err != nil {
		t.Fatalf("recover removed the folder state.json's control path names: %v", err)
	}
}

// TestRecoverRuntimeDir: what isRuntimeDir takes for a dead host's runtime
// folder.
func TestRecoverRuntimeDir(t *testing.T) {
	t.Setenv("TMPDIR", t.TempDir())
	real, err := os.MkdirTemp("", "vibedom-")
	if err != nil {
		t.Fatal(err)
	}
	open, err := os.MkdirTemp("", "vibedom-")
	if err != nil {
		t.Fatal(err)
	}
	os.Chmod(open, 0o755)
	elsewhere := filepath.Join(t.TempDir(), "vibedom-project")
	os.Mkdir(elsewhere, 0o700)
	link := filepath.Join(os.TempDir(), "vibedom-link")
	os.Symlink(elsewhere, link)
	for _, tc := range []struct {
		name    string
		control string
		want    bool
	}{
		{"a host's runtime folder", filepath.Join(real, controlSocket), true},
		{"none recorded", "", false},
		{"another file name", filepath.Join(real, "other.sock"), false},
		{"a relative path", "vibedom-x/" + controlSocket, false},
		{"a folder outside the temporary folder", filepath.Join(elsewhere, controlSocket), false},
		{"a folder open to others", filepath.Join(open, controlSocket), false},
		{"a symlink in the temporary folder", filepath.Join(link, controlSocket), false},
		{"the temporary folder itself", filepath.Join(os.TempDir(), controlSocket), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := isRuntimeDir(tc.control); got != tc.want {
				t.Errorf("isRuntimeDir(%q) = %v, want %v", tc.control, got, tc.want)
			}
		})
	}
}

// TestRecoverOneAtATime: while one recovery holds the session's lock, a
// second is refused at once with a one-line error.
func TestRecoverOneAtATime(t *testing.T) {
	t.Parallel()
	h := home.Home(t.TempDir())
	dir := h.Session("crashed")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	st := `{"name":"crashed","workspace":"/nonexistent-ws","created":"2026-01-01T00:00:00Z","status":"running","pid":2147483646,"log_dir":"/nonexistent-logs"}`
	if err := os.WriteFile(filepath.Join(dir, stateFile), []byte(st), 0o600); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, scratchFile), nil, 0o600)
	unlock, busy, err := tryLock(filepath.Join(dir, recoverLock))
	if err != nil || busy {
		t.Fatalf("first lock: busy %v, %v", busy, err)
	}
	_, err = Recover(context.Background(), RecoverOptions{Home: h, Name: "crashed"})
	if err == nil || !strings.Contains(err.Error(), "another `vibedom recover crashed` is running") {
		t.Fatalf("second recovery: %v", err)
	}
	unlock()
	// Released: the next one gets past the lock (and fails later, on the
	// missing workspace).
	_, err = Recover(context.Background(), RecoverOptions{Home: h, Name: "crashed"})
	if err == nil || strings.Contains(err.Error(), "is running") {
		t.Fatalf("after the lock was released: %v", err)
	}
}

// availableDriver says it can run VMs but starts none: a recovery with it
// goes as far as preparing the rescue VM.
type availableDriver struct{ unavailableDriver }

func (availableDriver) Available(context.Context, vm.Arch) error { return nil }

// TestRecoverTamperedState: recover follows nothing state.json says
// outside the vibedom home. A log folder elsewhere is refused and not
// created; a workspace that is a symlink to another folder, or a folder
// put in the place of the one the session started on, is refused. A
// temporary file a killed recovery left (.changes.patch.tmp-*) is removed.
func TestRecoverTamperedState(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	hm := home.Home(filepath.Join(root, "hm"))
	ws := filepath.Join(root, "ws")
	other := filepath.Join(root, "other")
	for _, d := range []string{ws, other} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	link := filepath.Join(root, "link")
	os.Symlink(other, link)
	outside := filepath.Join(root, "elsewhere", "logs")
	ownLogs := filepath.Join(hm.Logs(), "session-20260101-000000")
	cases := []struct {
		name   string
		st     State
		want   string
		absent string // must not exist afterwards
	}{
		{"log folder outside the hm", State{Workspace: ws, LogDir: outside}, "not under", outside},
		{"log folder up and out", State{Workspace: ws, LogDir: filepath.Join(hm.Logs(), "..", "..", "elsewhere", "x")}, "not under", filepath.Join(root, "elsewhere")},
		{"log folder not a session's", State{Workspace: ws, LogDir: filepath.Join(hm.Logs(), "keys")}, "not under", filepath.Join(hm.Logs(), "keys")},
		{"workspace through a symlink", State{Workspace: link, LogDir: ownLogs}, "now leads to", ""},
		{"workspace replaced", State{Workspace: ws, WorkspaceID: "1:2", LogDir: ownLogs}, "is not the folder session", ""},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			name := fmt.Sprintf("tampered-%d", i)
			dir := hm.Session(name)
			if err := os.MkdirAll(dir, 0o700); err != nil {
				t.Fatal(err)
			}
			os.WriteFile(filepath.Join(dir, scratchFile), []byte("disk"), 0o600)
			stale := filepath.Join(dir, ".changes.patch.tmp-123")
			os.WriteFile(stale, nil, 0o600)
			st := tc.st
			st.Name, st.Created, st.Status, st.PID = name, time.Now().UTC(), StatusRunning, 0
			b, _ := json.Marshal(st)
			if err := os.WriteFile(filepath.Join(dir, stateFile), b, 0o600); err != nil {
				t.Fatal(err)
			}
			_, err := Recover(t.Context(), RecoverOptions{Home: hm, Name: name, Driver: availableDriver{}})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("recover: %v, want it to say %q", err, tc.want)
			}
			if tc.absent != "" {
				if _, err := os.Lstat(tc.absent); err == nil {
					t.Errorf("recover created %s", tc.absent)
				}
			}
			if _, err := os.Stat(stale); err == nil {
				t.Error("the stale temporary patch file is still there")
			}
			if _, err := os.Stat(filepath.Join(dir, scratchFile)); err != nil {
				t.Errorf("the scratch disk is gone: %v", err)
			}
		})
	}
}

// TestRecoveringStatus: while recover runs, the session is "recovering"
// (not "running"); when the recovering process is gone, it is crashed again.
func TestRecoveringStatus(t *testing.T) {
	t.Parallel()
	h := home.Home(t.TempDir())
	dir := h.Session("r")
	os.MkdirAll(dir, 0o700)
	st := State{Name: "r", Workspace: t.TempDir(), Created: time.Now().UTC(), Status: StatusRecovering, PID: os.Getpid(), PIDStart: procStart(os.Getpid())}
	b, _ := json.Marshal(st)
	os.WriteFile(filepath.Join(dir, stateFile), b, 0o600)
	i, err := FindSession(h, "r")
	if err != nil || i.Live != StatusRecovering {
		t.Fatalf("live status %v, %v; want recovering", i.Live, err)
	}
	st.PID = 2147483646
	b, _ = json.Marshal(st)
	os.WriteFile(filepath.Join(dir, stateFile), b, 0o600)
	if i, _ = FindSession(h, "r"); i.Live != StatusCrashed {
		t.Errorf("a recovery whose process is gone: %v, want crashed", i.Live)
	}
}
