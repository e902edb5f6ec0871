package session

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/websocket"
)

// devServer is a stand-in for a dev server in the guest (the in-process
// guest shares this loopback): HTTP on /, a WebSocket echo on /ws.
func devServer(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) { fmt.Fprintf(w, "hello from the guest %s", r.URL.Path) })
	mux.Handle("/ws", websocket.Handler(func(ws *websocket.Conn) { io.Copy(ws, ws) }))
	srv := &http.Server{Handler: mux}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().(*net.TCPAddr).Port
}

func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

func portReq(t *testing.T, s *sess, action, spec string) (*ControlReply, error) {
	t.Helper()
	conn, err := DialControl(&Info{State: s.snapshotState(), Live: StatusRunning, Dir: s.dir})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	return conn.Do(ControlRequest{Op: OpPort, Port: &PortRequest{Action: action, Spec: spec}}, 10*time.Second)
}

// TestPublishedPorts: through the control socket, `port add` publishes a
// guest port on the host's loopback; HTTP and a WebSocket echo work over
// it (the guest side is the real guest agent, over its control channel),
// the WebSocket stays open across other requests, status lists the port,
// connections beyond the bound are closed, another session cannot take the
// same host port, and `port rm` closes the listener and its connections.
func TestPublishedPorts(t *testing.T) {
	s := controlHost(t, os.Getuid())
	s.ctl.ports.maxConns = 3
	s.client = inProcessGuest(t)
	s.startPorts()
	guestPort := devServer(t)
	hostPort := freePort(t)
	spec := fmt.Sprintf("%d:%d", hostPort, guestPort)
	rep, err := portReq(t, s, PortAdd, spec)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Ports) != 1 || rep.Ports[0].Host != "127.0.0.1:"+strconv.Itoa(hostPort) || rep.Ports[0].Guest != guestPort {
		t.Fatalf("port add: %+v", rep.Ports)
	}
	base := "http://127.0.0.1:" + strconv.Itoa(hostPort)
	get := func() (string, error) {
		resp, err := (&http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}).Get(base + "/index.html")
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return string(b), err
	}
	if body, err := get(); err != nil || body != "hello from the guest /index.html" {
		t.Fatalf("HTTP through the published port: %q %v", body, err)
	}
	ws, err := websocket.Dial("ws://127.0.0.1:"+strconv.Itoa(hostPort)+"/ws", "", base)
	if err != nil {
		t.Fatal(err)
	}
	echo := func(msg string) {
		t.Helper()
		if err := websocket.Message.Send(ws, msg); err != nil {
			t.Fatal(err)
		}
		var got string
		ws.SetReadDeadline(time.Now().Add(10 * time.Second))
		if err := websocket.Message.Receive(ws, &got); err != nil || got != msg {
			t.Fatalf("WebSocket echo: %q %v", got, err)
		}
	}
	echo("hot reload")
	for i := range 5 { // the WebSocket stays open while other requests come and go
		if _, err := get(); err != nil {
			t.Fatal(err)
		}
		echo(fmt.Sprint("message ", i))
	}
	// status lists the port; the HTTP connections are gone, the WebSocket open.
	waitFor(t, "status to show one open connection", func() bool {
		st := s.hostStatus()
		return len(st.Ports) == 1 && st.Ports[0].Host == "127.0.0.1:"+strconv.Itoa(hostPort) && st.Ports[0].Open == 1
	})

	// The bound: the WebSocket plus two idle connections fill it; the next
	// is closed at once.
	var idle []net.Conn
	for range 2 {
		c, err := net.Dial("tcp", "127.0.0.1:"+strconv.Itoa(hostPort))
		if err != nil {
			t.Fatal(err)
		}
		idle = append(idle, c)
	}
	waitFor(t, "three open connections", func() bool { return s.hostStatus().Ports[0].Open == 3 })
	extra, err := net.Dial("tcp", "127.0.0.1:"+strconv.Itoa(hostPort))
	if err == nil {
		extra.SetReadDeadline(time.Now().Add(10 * time.Second))
		fmt.Fprintf(extra, "GET / HTTP/1.0\r\n\r\n")
		if line, err := bufio.NewReader(extra).ReadString('\n'); err == nil {
			t.Errorf("a connection past the bound was served: %q", line)
		}
		extra.Close()
	}
	for _, c := range idle {
		c.Close()
	}

	// Another session cannot publish the same host port.
	other := controlHost(t, os.Getuid())
	other.client = s.client
	if _, err := portReq(t, other, PortAdd, spec); err == nil || !strings.Contains(err.Error(), "is taken") {
		t.Errorf("a second session on the same host port: %v", err)
	}
	if _, err := portReq(t, s, PortAdd, "80"); err == nil || !strings.Contains(err.Error(), "privileged") {
		t.Errorf("a privileged port: %v", err)
	}

	// rm: the listener goes, and so does the open WebSocket.
	if rep, err := portReq(t, s, PortRm, strconv.Itoa(hostPort)); err != nil || len(rep.Ports) != 0 {
		t.Fatalf("port rm: %+v %v", rep, err)
	}
	var got string
	ws.SetReadDeadline(time.Now().Add(10 * time.Second))
	if err := websocket.Message.Receive(ws, &got); err == nil {
		t.Errorf("the WebSocket outlived port rm: %q", got)
	}
	if _, err := get(); err == nil {
		t.Error("the port still answers after port rm")
	}
	if _, err := portReq(t, s, PortRm, strconv.Itoa(hostPort)); err == nil {
		t.Error("removing a port twice succeeded")
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestRunPortsBeforeBoot: the ports of run -p are bound before anything
// boots: a taken one fails the start with one line; the session's cleanup
// frees the ones it bound.
func TestRunPortsBeforeBoot(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	free := freePort(t)
	takenPort := taken.Addr().(*net.TCPAddr).Port
	s := &sess{ctl: newHostCtl(), opts: Options{Ports: []PortSpec{
		{HostAddr: DefaultPortAddr, HostPort: free, GuestPort: 3000},
		{HostAddr: DefaultPortAddr, HostPort: takenPort, GuestPort: 3001},
	}}}
	err = s.openPorts()
	if err == nil || !strings.Contains(err.Error(), "is taken") || strings.Contains(err.Error(), "\n") {
		t.Fatalf("a taken port: %v", err)
	}
	if err := s.cleanup.run(); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(free))
	if err != nil {
		t.Fatalf("the session's end left port %d bound: %v", free, err)
	}
	ln.Close()
}
