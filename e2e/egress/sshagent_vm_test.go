package egress

import (
	"bufio"
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
	"golang.org/x/sys/unix"

	"github.com/vibedom/vibedom/e2e/clitest"
)

// TestGitPushSSHAgentVM: `vibedom run --ssh-agent` in the test image, as
// the agent user, pushes with git over SSH to a git server on the host's
// loopback (reached as gitserver.test:22 through the policy rule and
// --resolve). The deploy key signs through the forwarded agent: the push
// lands in the bare repository, the signature is in ssh_agent.jsonl, and the
// private key is nowhere in the guest (its scratch disk, its environment,
// its tmpfs folders) nor in the session's logs.
func TestGitPushSSHAgentVM(t *testing.T) {
	c, bin, deploy, bare, srv := gitPushHome(t)

	ws := clitest.SampleWorkspace(t)
	head := clitest.CommitAll(t, ws, "from the host")
	buildForGuest(t, "./testdata/gitssh", filepath.Join(ws, ".gitssh"))

	script := `set -e
cd /work
id -un
echo "sock=$SSH_AUTH_SOCK"
export GIT_SSH=/work/.gitssh GIT_SSH_VARIANT=simple GITSSH_HOSTKEY='` + srv.hostKey + `'
git -c user.name=a -c user.email=a@example.invalid commit -q --allow-empty -m "from the guest"
git push ssh://git@gitserver.test/repo.git HEAD:main 2>&1
git rev-parse HEAD
sync
echo PUSHED
read go_on
echo ENV-BEGIN; env; cat /proc/self/environ; echo; echo ENV-END
echo TAR-BEGIN; tar cf - /tmp /run /home 2>/dev/null || true; echo; echo TAR-END
`
	cmd := exec.Command(bin, "run", ws, "--ssh-agent", "--no-review", "--preflight=off", "--memory", "512M",
		"--allow", "gitserver.test:22", "--resolve", "gitserver.test:22:127.0.0.1:"+srv.port,
		"--", "sh", "-c", script)
	cmd.Env = append(c.Env, "HOME="+srv.userHome(t))
	stdin, _ := cmd.StdinPipe()
	stdoutR, _ := cmd.StdoutPipe()
	var stderr lockedBuf
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var stdout bytes.Buffer
	pushed := make(chan struct{})
	copied := make(chan struct{})
	go func() {
		defer close(copied)
		br := bufio.NewReader(stdoutR)
		signalled := false
		for {
			line, err := br.ReadBytes('\n')
			stdout.Write(line)
			if !signalled && string(line) == "PUSHED\n" {
				signalled = true
				close(pushed)
			}
			if err != nil {
				return
			}
		}
	}()
	select {
	case <-pushed:
	case <-copied:
	case <-time.After(5 * time.Minute):
		cmd.Process.Kill()
	}
	// While the VM still runs: its scratch disk, as written so far.
	var scratch []byte
	if imgs, _ := filepath.Glob(filepath.Join(c.Home, "sessions", "*", "scratch.img")); len(imgs) == 1 {
		scratch = readSparse(t, imgs[0])
	} else {
		t.Errorf("scratch disks while the session runs: %v", imgs)
	}
	io.WriteString(stdin, "go\n")
	stdin.Close()
	<-copied
	err := cmd.Wait()
	out := stdout.String()
	if err != nil {
		t.Fatalf("run: %v\nstdout:\n%.4000s\nstderr:\n%s", err, out, stderr.String())
	}
	before, _, ok := strings.Cut(out, "PUSHED\n")
	if !ok || !strings.Contains(out, "ENV-BEGIN") {
		t.Fatalf("the guest script did not get through:\n%.4000s\nstderr:\n%s", out, stderr.String())
	}
	lines := strings.Split(before, "\n")
	guestHead := lines[len(lines)-2]
	t.Logf("guest:\n%s", before)

	// The push landed.
	if !strings.HasPrefix(out, "agent\n") || !strings.Contains(out, "sock=/run/vibedom-agent-") {
		t.Errorf("not the agent user, or no agent socket in the root's /run:\n%s", out)
	}
	got := strings.TrimSpace(clitest.Git(t, "", "--git-dir", bare, "log", "--format=%H %s", "-n", "2", "main"))
	if want := guestHead + " from the guest\n" + head + " from the host"; got != want {
		t.Errorf("bare repository's main:\n%s\nwant:\n%s", got, want)
	}
	if srv.logins() != 1 {
		t.Errorf("logins to the git server: %d", srv.logins())
	}

	// The signature was logged.
	var signs []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(readSessionFile(t, c, "ssh_agent.jsonl")), "\n") {
		var e map[string]any
		if json.Unmarshal([]byte(line), &e) != nil {
			t.Errorf("agent log line %q", line)
		}
		if e["op"] == "sign" {
			signs = append(signs, e)
		}
	}
	if len(signs) != 1 || signs[0]["decision"] != "allow" || signs[0]["user"] != "git" || signs[0]["key"] != deploy.fingerprint ||
		signs[0]["session_id"] == "" || signs[0]["time"] == nil || signs[0]["server"] != "gitserver.test:22" ||
		signs[0]["server_host_key"] != srv.hostKey {
		t.Errorf("signatures logged: %v", signs)
	}
	if net := readSessionFile(t, c, "network.jsonl"); !strings.Contains(net, `"name":"gitserver.test","port":22`) || !strings.Contains(net, "spliced") {
		t.Errorf("network.jsonl has no spliced gitserver.test:22 connection:\n%s", net)
	}

	// The private key is nowhere but in the host's key file.
	if !strings.Contains(out, "ENV-END") || !strings.Contains(out, "TAR-END") {
		t.Errorf("the guest did not dump its environment and tmpfs folders")
	}
	if len(scratch) == 0 {
		t.Errorf("scratch disk read nothing")
	}
	places := map[string][]byte{"guest output (env, /tmp, /run, /home)": []byte(out), "stderr": []byte(stderr.String()), "scratch disk": scratch}
	for _, root := range []string{filepath.Join(c.Home, "logs"), filepath.Join(c.Home, "sessions")} {
		filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err == nil && d.Type().IsRegular() {
				b, _ := os.ReadFile(p)
				places[p] = b
			}
			return nil
		})
	}
	_, tarOut, _ := strings.Cut(out, "TAR-BEGIN\n")
	tarOut, _, _ = strings.Cut(tarOut, "TAR-END")
	if len(tarOut) < 1024 {
		t.Errorf("the guest's tar of /tmp /run /home is %d bytes: no archive", len(tarOut))
	}
	t.Logf("searched for the private key: scratch disk data %d bytes, guest dump %d bytes (tar %d), %d host files", len(scratch), len(out), len(tarOut), len(places)-3)
	for where, b := range places {
		for _, n := range deploy.needles {
			if bytes.Contains(b, n.value) {
				t.Errorf("the deploy key's private half (%s) is in %s", n.form, where)
			}
		}
	}
	c.AssertNothingLeft(t)
}

// TestGitPushSSHAgentDetachedVM: with `run --detach --ssh-agent` the
// agent's command (on the guest's kept terminal) and a `vibedom exec` from
// the control socket each get a forwarded agent and push over SSH.
func TestGitPushSSHAgentDetachedVM(t *testing.T) {
	c, bin, _, bare, srv := gitPushHome(t)
	ws := clitest.SampleWorkspace(t)
	head := clitest.CommitAll(t, ws, "from the host")
	buildForGuest(t, "./testdata/gitssh", filepath.Join(ws, ".gitssh"))
	c.Env = append(c.Env, "HOME="+srv.userHome(t))
	push := `cd /work && GIT_SSH=/work/.gitssh GIT_SSH_VARIANT=simple GITSSH_HOSTKEY='` + srv.hostKey + `' git push ssh://git@gitserver.test/repo.git HEAD:`
	// The agent's command waits for the exec's push, then pushes too.
	kept := `while [ ! -e /tmp/exec-pushed ]; do sleep 0.2; done; ` + push + `kept > /tmp/kept.log 2>&1; echo $? > /tmp/kept.status; sleep 600`
	stdout, stderr, code := c.RunWith(t, bin, "", "run", ws, "--detach", "--name", "pushy", "--ssh-agent", "--no-review", "--preflight=off", "--memory", "512M",
		"--allow", "gitserver.test:22", "--resolve", "gitserver.test:22:127.0.0.1:"+srv.port, "--", "sh", "-c", kept)
	if code != 0 {
		t.Fatalf("run --detach: exit %d\n%s\n%s", code, stdout, stderr)
	}
	defer c.RunWith(t, bin, "", "stop", "pushy")
	stdout, stderr, code = c.RunWith(t, bin, "", "exec", "pushy", "--", "sh", "-c",
		`echo "sock=$SSH_AUTH_SOCK"; `+push+`main 2>&1 && touch /tmp/exec-pushed && for i in $(seq 150); do [ -e /tmp/kept.status ] && break; sleep 0.2; done; cat /tmp/kept.log; echo "kept status $(cat /tmp/kept.status)"`)
	if code != 0 || !strings.Contains(stdout, "sock=/run/vibedom-agent-") || !strings.Contains(stdout, "kept status 0") {
		t.Errorf("exec: exit %d\n%s\n%s", code, stdout, stderr)
	}
	if _, stderr, code := c.RunWith(t, bin, "", "stop", "pushy"); code != 0 {
		t.Errorf("stop: exit %d %s", code, stderr)
	}
	for _, ref := range []string{"main", "kept"} {
		if got := strings.TrimSpace(clitest.Git(t, "", "--git-dir", bare, "rev-parse", ref)); got != head {
			t.Errorf("bare repository's %s: %s, want %s", ref, got, head)
		}
	}
	if n := strings.Count(readSessionFile(t, c, "ssh_agent.jsonl"), `"op":"sign","decision":"allow"`); n != 2 {
		t.Errorf("%d signatures logged, want 2", n)
	}
	c.AssertNothingLeft(t)
}

// TestSSHAgentRelayedLoginVM is issue 18 item 9 the way an attacker does
// it: an SSH client outside the VM logs in to a real SSH server (the
// loopback git server) on its own connection and relays the login request
// it must sign, through an allowed HTTP name (relay.test:80; no :22 rule),
// to a program in the guest that has the forwarded agent sign it. The agent
// refuses (no SSH connection carried by the host has that session id), the
// refusal is an alert in ssh_agent.jsonl, and the outsider does not log in.
func TestSSHAgentRelayedLoginVM(t *testing.T) {
	c, bin, deploy, _, srv := gitPushHome(t)

	// The outsider's relay: /req hands the guest what to sign, /sig and
	// /err bring back the agent's answer.
	toSign := make(chan []byte, 1)
	answer := make(chan relayAnswer, 1)
	mux := http.NewServeMux()
	mux.HandleFunc("/req", func(w http.ResponseWriter, r *http.Request) {
		select {
		case d := <-toSign:
			w.Write(d)
		case <-r.Context().Done():
		}
	})
	mux.HandleFunc("/sig", func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		answer <- relayAnswer{sig: b}
	})
	mux.HandleFunc("/err", func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		answer <- relayAnswer{err: errors.New(string(b))}
	})
	relay := httptest.NewServer(mux)
	defer relay.Close()
	_, relayPort, _ := net.SplitHostPort(relay.Listener.Addr().String())

	outsider := make(chan error, 1)
	go func() {
		cl, err := ssh.Dial("tcp", "127.0.0.1:"+srv.port, &ssh.ClientConfig{
			User:            "git",
			Auth:            []ssh.AuthMethod{ssh.PublicKeys(relaySigner{pub: deploy.pub, toSign: toSign, answer: answer})},
			HostKeyCallback: ssh.InsecureIgnoreHostKey(),
		})
		if err == nil {
			cl.Close()
		}
		outsider <- err
	}()

	ws := clitest.SampleWorkspace(t)
	buildForGuest(t, "./testdata/agentrelay", filepath.Join(ws, ".agentrelay"))
	stdout, stderr, code := c.RunWith(t, bin, "", "run", ws, "--ssh-agent", "--no-review", "--preflight=off", "--memory", "512M",
		"--allow", "relay.test:80", "--resolve", "relay.test:80:127.0.0.1:"+relayPort,
		"--", "sh", "-c", "RELAY_URL=http://relay.test /work/.agentrelay")
	t.Logf("guest (exit %d):\n%s", code, stdout)
	select {
	case answer <- relayAnswer{err: errors.New("the guest gave no answer")}:
	default:
	}
	select {
	case err := <-outsider:
		if err == nil {
			t.Errorf("the outsider logged in as the deploy key with a signature relayed from the guest")
		}
	case <-time.After(2 * time.Minute):
		t.Fatal("the outsider's login did not end")
	}
	if n := srv.logins(); n != 0 {
		t.Errorf("%d logins to the SSH server", n)
	}
	if !strings.Contains(stdout, "agent refused") {
		t.Errorf("the guest's agent request was not refused:\n%s\nstderr:\n%s", stdout, stderr)
	}
	var refusals int
	for _, line := range strings.Split(strings.TrimSpace(readSessionFile(t, c, "ssh_agent.jsonl")), "\n") {
		var e map[string]any
		if json.Unmarshal([]byte(line), &e) != nil {
			t.Errorf("agent log line %q", line)
			continue
		}
		if e["op"] != "sign" {
			continue
		}
		if e["decision"] != "deny" || e["alert"] != true || !strings.Contains(fmt.Sprint(e["reason"]), "no SSH connection") {
			t.Errorf("agent log: %s", line)
		}
		refusals++
	}
	if refusals != 1 {
		t.Errorf("%d refused signatures logged, want 1", refusals)
	}
	c.AssertNothingLeft(t)
}

type relayAnswer struct {
	sig []byte
	err error
}

// relaySigner is the outsider's key: it has the guest sign.
type relaySigner struct {
	pub    ssh.PublicKey
	toSign chan<- []byte
	answer <-chan relayAnswer
}

func (r relaySigner) PublicKey() ssh.PublicKey { return r.pub }

func (r relaySigner) Sign(_ io.Reader, data []byte) (*ssh.Signature, error) {
	r.toSign <- data
	a := <-r.answer
	if a.err != nil {
		return nil, a.err
	}
	var sig ssh.Signature
	if err := ssh.Unmarshal(a.sig, &sig); err != nil {
		return nil, err
	}
	return &sig, nil
}

type deployKey struct {
	pub         ssh.PublicKey
	fingerprint string
	needles     []needle
}

type needle struct {
	form  string
	value []byte
}

// gitPushHome is a home with the test image and its deploy key, and a
// bare repository served by a git server on loopback that accepts that
// key.
func gitPushHome(t *testing.T) (c *clitest.CLI, bin string, deploy deployKey, bare string, srv *gitServer) {
	t.Helper()
	c, bin = clitest.GuestImageHome(t)
	deploy = readDeployKey(t, c.Home)
	bare = filepath.Join(t.TempDir(), "repo.git")
	clitest.Git(t, "", "init", "-q", "--bare", bare)
	return c, bin, deploy, bare, newGitServer(t, deploy.pub, bare)
}

// readDeployKey reads the home's deploy key and returns the forms of its
// private half a leak would take: the raw seed, its hex and base64, and the
// lines of the key file's base64 body that hold it.
func readDeployKey(t *testing.T, home string) deployKey {
	t.Helper()
	path := filepath.Join(home, "keys", "id_ed25519_vibedom")
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := ssh.ParseRawPrivateKey(data)
	if err != nil {
		t.Fatal(err)
	}
	priv := *raw.(*ed25519.PrivateKey)
	seed := priv.Seed()
	pub, _ := ssh.NewPublicKey(priv.Public())
	k := deployKey{pub: pub, fingerprint: ssh.FingerprintSHA256(pub)}
	k.needles = []needle{
		{"raw", seed}, {"hex", []byte(hex.EncodeToString(seed))},
		{"base64", []byte(base64.RawStdEncoding.EncodeToString(seed)[:40])},
		{"base64url", []byte(base64.RawURLEncoding.EncodeToString(seed)[:40])},
	}
	block, _ := pem.Decode(data)
	at := bytes.Index(block.Bytes, seed)
	if at < 0 {
		t.Fatal("seed not found in the key file")
	}
	var body []string
	for _, l := range strings.Split(string(data), "\n") {
		if l != "" && !strings.HasPrefix(l, "-----") {
			body = append(body, l)
		}
	}
	for i, l := range body {
		// Each 64- or 70-character line holds len(l)*3/4 bytes.
		per := len(body[0]) * 3 / 4
		if from := i * per; from < at+len(seed) && from+per > at {
			k.needles = append(k.needles, needle{fmt.Sprintf("key file line %d", i+1), []byte(l)})
		}
	}
	if len(k.needles) < 5 {
		t.Fatalf("no key file line holds the seed")
	}
	return k
}

// readSparse reads the data extents of a sparse file.
func readSparse(t *testing.T, path string) []byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fi, _ := f.Stat()
	var out []byte
	fd := int(f.Fd())
	for off := int64(0); off < fi.Size(); {
		data, err := unix.Seek(fd, off, unix.SEEK_DATA)
		if err != nil {
			break // ENXIO: no data past off
		}
		hole, err := unix.Seek(fd, data, unix.SEEK_HOLE)
		if err != nil {
			hole = fi.Size()
		}
		buf := make([]byte, hole-data)
		if _, err := f.ReadAt(buf, data); err != nil && !errors.Is(err, io.EOF) {
			t.Fatal(err)
		}
		out = append(out, buf...)
		out = append(out, 0)
		off = hole
	}
	return out
}

// gitServer is a git-over-SSH server on loopback: it accepts only one
// public key and runs the real `git receive-pack` on one bare repository.
type gitServer struct {
	port, hostKey string
	pub           ssh.PublicKey
	mu            sync.Mutex
	n             int
}

func (g *gitServer) logins() int { g.mu.Lock(); defer g.mu.Unlock(); return g.n }

// userHome is a HOME whose ~/.ssh/known_hosts lists the server's key for
// gitserver.test, as a user who has pushed there before has it: the agent
// signs only for a server known_hosts lists.
func (g *gitServer) userHome(t *testing.T) string {
	t.Helper()
	home := t.TempDir()
	if err := os.Mkdir(filepath.Join(home, ".ssh"), 0o700); err != nil {
		t.Fatal(err)
	}
	line := "gitserver.test " + string(ssh.MarshalAuthorizedKey(g.pub))
	if err := os.WriteFile(filepath.Join(home, ".ssh", "known_hosts"), []byte(line), 0o600); err != nil {
		t.Fatal(err)
	}
	return home
}

func newGitServer(t *testing.T, allowed ssh.PublicKey, bare string) *gitServer {
	t.Helper()
	_, hk, _ := ed25519.GenerateKey(rand.Reader)
	hs, _ := ssh.NewSignerFromKey(hk)
	g := &gitServer{hostKey: ssh.FingerprintSHA256(hs.PublicKey()), pub: hs.PublicKey()}
	cfg := &ssh.ServerConfig{PublicKeyCallback: func(m ssh.ConnMetadata, k ssh.PublicKey) (*ssh.Permissions, error) {
		if m.User() == "git" && bytes.Equal(k.Marshal(), allowed.Marshal()) {
			return nil, nil
		}
		return nil, errors.New("not the deploy key")
	}}
	cfg.AddHostKey(hs)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	_, g.port, _ = net.SplitHostPort(ln.Addr().String())
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go g.serve(conn, cfg, bare)
		}
	}()
	return g
}

func (g *gitServer) serve(conn net.Conn, cfg *ssh.ServerConfig, bare string) {
	defer conn.Close()
	_, chans, reqs, err := ssh.NewServerConn(conn, cfg)
	if err != nil {
		return
	}
	g.mu.Lock()
	g.n++
	g.mu.Unlock()
	go ssh.DiscardRequests(reqs)
	for nc := range chans {
		if nc.ChannelType() != "session" {
			nc.Reject(ssh.UnknownChannelType, "")
			continue
		}
		ch, creqs, err := nc.Accept()
		if err != nil {
			continue
		}
		go func() {
			defer ch.Close()
			for r := range creqs {
				var e struct{ Command string }
				if r.Type != "exec" || ssh.Unmarshal(r.Payload, &e) != nil ||
					(e.Command != "git-receive-pack '/repo.git'" && e.Command != "git-receive-pack 'repo.git'") {
					r.Reply(false, nil)
					continue
				}
				r.Reply(true, nil)
				cmd := exec.Command("git", "receive-pack", bare)
				cmd.Stdout, cmd.Stderr = ch, ch.Stderr()
				in, _ := cmd.StdinPipe()
				status := uint32(1)
				if cmd.Start() == nil {
					go func() { io.Copy(in, ch); in.Close() }()
					if cmd.Wait() == nil {
						status = 0
					}
				}
				ch.SendRequest("exit-status", false, ssh.Marshal(struct{ S uint32 }{status}))
				return
			}
		}()
	}
}

type lockedBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}
func (l *lockedBuf) String() string { l.mu.Lock(); defer l.mu.Unlock(); return l.b.String() }
