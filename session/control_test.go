package session

import (
	"bufio"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// controlHost is a session host with only its control socket: no VM.
func controlHost(t *testing.T, uid int) *sess {
	t.Helper()
	s := &sess{ctl: newHostCtl(), ctlUID: uid, runDir: t.TempDir(), dir: t.TempDir(), name: "t",
		log: slog.New(slog.DiscardHandler)}
	os.Chmod(s.runDir, 0o700) // as os.MkdirTemp makes it
	s.state = State{Name: "t", Workspace: "/w", PID: os.Getpid(), PIDStart: procStart(os.Getpid()), Status: StatusRunning}
	if err := s.startControl(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.cleanup.run() })
	return s
}

func ask(t *testing.T, path string) (string, error) {
	t.Helper()
	c, err := net.Dial("unix", path)
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	io.WriteString(c, `{"op":"status"}`+"\n")
	return bufio.NewReader(c).ReadString('\n')
}

func TestControlSocketServesItsUser(t *testing.T) {
	t.Parallel()
	s := controlHost(t, os.Getuid())
	line, err := ask(t, s.state.Control)
	if err != nil {
		t.Fatal(err)
	}
	var rep ControlReply
	if err := json.Unmarshal([]byte(line), &rep); err != nil || !rep.OK || rep.Status == nil || rep.Status.Name != "t" {
		t.Fatalf("status reply %q: %v", line, err)
	}
	fi, err := os.Stat(s.state.Control)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("socket mode %v %v", fi.Mode(), err)
	}
	// Through DialControl, as the commands do.
	i := &Info{State: s.snapshotState(), Live: StatusRunning, Dir: s.dir}
	conn, err := DialControl(i)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	rep2, err := conn.Do(ControlRequest{Op: OpStatus}, 10*time.Second)
	if err != nil || rep2.Status.PID != os.Getpid() {
		t.Fatalf("DialControl status: %v %v", rep2, err)
	}
	if _, err := conn.Do(ControlRequest{Op: "format-disk"}, 10*time.Second); err == nil {
		t.Error("an unknown request was accepted")
	}
}

// TestControlSocketRefusesOtherUids: a peer whose uid is not the session's
// user gets nothing, even when it can reach the socket.
func TestControlSocketRefusesOtherUids(t *testing.T) {
	t.Parallel()
	s := controlHost(t, os.Getuid()+4242)
	line, err := ask(t, s.state.Control)
	if err == nil || line != "" {
		t.Fatalf("a peer with the wrong uid got %q", line)
	}
}

// TestControlSocketRefusesAnotherUser runs a real client as another local
// user (nobody) against a socket it is allowed to reach: the host refuses
// it. Needs root to switch users.
func TestControlSocketRefusesAnotherUser(t *testing.T) {
	t.Parallel()
	if os.Getuid() != 0 {
		t.Skip("needs root to run a client as another user")
	}
	s := controlHost(t, os.Getuid())
	// Open the way so only the peer check stands between.
	for d := s.runDir; d != os.TempDir() && d != "/"; d = filepath.Dir(d) {
		os.Chmod(d, 0o755)
	}
	os.Chmod(s.state.Control, 0o666)
	// A copy of the test binary that nobody may run.
	dir, err := os.MkdirTemp("", "vibedom-ctltest-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	os.Chmod(dir, 0o755)
	self, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "client.test")
	if err := os.WriteFile(bin, self, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-test.run=^TestHelperControlClient$")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "VIBEDOM_TEST_CONTROL="+s.state.Control)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("client as nobody: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "REFUSED") {
		t.Fatalf("a client running as nobody was served:\n%s", out)
	}
	// The session's own user is still served.
	if line, err := ask(t, s.state.Control); err != nil || !strings.Contains(line, `"ok":true`) {
		t.Fatalf("own user after the refusal: %q %v", line, err)
	}
}

func TestHelperControlClient(t *testing.T) {
	t.Parallel()
	path := os.Getenv("VIBEDOM_TEST_CONTROL")
	if path == "" {
		t.Skip("helper process only")
	}
	c, err := net.Dial("unix", path)
	if err != nil {
		os.Stdout.WriteString("CANNOT-CONNECT " + err.Error() + "\n")
		return
	}
	c.Close()
	line, err := ask(t, path)
	if err != nil || line == "" {
		os.Stdout.WriteString("REFUSED\n")
		return
	}
	os.Stdout.WriteString("SERVED " + line)
}

// TestDialControlRefusesUnsafeSockets: the commands do not talk to a socket
// in a folder others can reach, nor to one served by another process than
// the session host state.json names.
func TestDialControlRefusesUnsafeSockets(t *testing.T) {
	t.Parallel()
	s := controlHost(t, os.Getuid())
	i := &Info{State: s.snapshotState(), Live: StatusRunning, Dir: s.dir}
	os.Chmod(s.runDir, 0o755)
	if _, err := DialControl(i); err == nil || !strings.Contains(err.Error(), "open to other users") {
		t.Errorf("socket in an open folder: %v", err)
	}
	os.Chmod(s.runDir, 0o700)
	i.PID = os.Getpid() + 1
	if _, err := DialControl(i); err == nil || !strings.Contains(err.Error(), "not by this user's session host") {
		t.Errorf("socket served by another process: %v", err)
	}
	link := filepath.Join(t.TempDir(), "link")
	os.Symlink(s.runDir, link)
	i.PID, i.Control = os.Getpid(), filepath.Join(link, controlSocket)
	if _, err := DialControl(i); err == nil {
		t.Error("socket behind a symlinked folder accepted")
	}
}

// TestControlFrames: frames split large writes and refuse oversized ones.
func TestControlFrames(t *testing.T) {
	t.Parallel()
	r, w := io.Pipe()
	fw := &frameWriter{w: w}
	big := strings.Repeat("x", maxFrame+10)
	go func() {
		fw.frame(frameData, []byte(big))
		w.Close()
	}()
	var got []byte
	for {
		typ, p, err := readFrame(r)
		if err != nil {
			break
		}
		if typ != frameData {
			t.Fatalf("type %q", typ)
		}
		got = append(got, p...)
	}
	if string(got) != big {
		t.Errorf("got %d bytes back", len(got))
	}
	bad := []byte{frameData, 0xff, 0xff, 0xff, 0xff}
	if _, _, err := readFrame(strings.NewReader(string(bad))); err == nil {
		t.Error("an oversized frame was accepted")
	}
}

// TestNoPauseWhileCollecting: once the agent ended and the host winds the
// session up, a pause (which would freeze the collection) or an exec is
// refused.
func TestNoPauseWhileCollecting(t *testing.T) {
	t.Parallel()
	s := controlHost(t, os.Getuid())
	s.windUp(t.Context())
	if _, err := s.pause(t.Context(), false); err == nil || !strings.Contains(err.Error(), "stopping") {
		t.Errorf("pause while collecting: %v", err)
	}
	if err := s.checkRunning(); err == nil {
		t.Error("exec or attach accepted while collecting")
	}
}
