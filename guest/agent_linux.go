package guest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/crypto/ssh"
	"golang.org/x/sys/unix"

	"github.com/vibedom/vibedom/guest/proto"
)

// Agent serves the control channel described by the boot data until the
// host asks the guest to power off; then it ends every process, unmounts
// and powers the machine off itself. It runs as PID 1's child and logs to
// its stderr, which PID 1 points at the console. It returns only on error.
func Agent() error {
	data, err := os.ReadFile(proto.BootConfigPath)
	if err != nil {
		return fmt.Errorf("read boot data: %w", err)
	}
	bc, err := proto.Parse(data)
	if err != nil {
		return err
	}
	log := consoleLogger(os.Stderr, bc.Debug)
	hostKey, authorized, err := loadKeys(bc)
	if err != nil {
		return err
	}
	// A command running "kill -TERM -1" (or a script's trap doing so) must
	// not take the control channel down with it. Handled signals, unlike
	// ignored ones, are reset to their defaults in the commands started.
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGINT)
	go func() {
		for sig := range sigs {
			log.Debug("signal ignored", "signal", sig.String())
		}
	}()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var once sync.Once
	poweroff := func(reason string) {
		once.Do(func() {
			log.Info("powering off: " + reason)
			Shutdown(log)
			cancel()
			halt(log)
		})
	}
	if _, err := recordBases(log, proto.WorkDir, proto.UpperDir, basesFile); err != nil {
		log.Warn("copy-up bases are not recorded: files both you and the agent change will be conflicts", "err", err)
	}
	var img *ImageRoot
	if bc.Root != nil {
		agent, err := lookupUser(proto.RootDir, proto.RootAgentUser)
		if err != nil {
			log.Warn("commands cannot run as the agent user", "err", err)
		}
		img = &ImageRoot{Dir: proto.RootDir, Agent: agent}
	}
	srv, err := NewServer(ServerConfig{
		Image:          img,
		HostKey:        hostKey,
		AuthorizedKeys: authorized,
		Shell:          "/bin/sh",
		WorkDir:        proto.WorkDir,
		Env:            SessionEnv(bc, caBundle(bc)),
		Poweroff:       func() { poweroff("the host asked") },
		Log:            log,
	})
	if err != nil {
		return err
	}
	go watchPowerButton(ctx, log, func() { poweroff("power button pressed") })
	switch bc.Control.Transport {
	case proto.TransportVirtioSerial:
		return serveVirtioSerial(ctx, log, srv, bc.Control.Name)
	case proto.TransportVsock:
		return serveVsock(ctx, log, srv, bc.Control.Port)
	}
	return fmt.Errorf("unknown control transport %q", bc.Control.Transport)
}

// loadKeys reads the host key from proto.HostKeyPath and parses the
// authorized keys of the boot data.
func loadKeys(bc *proto.BootConfig) (ssh.Signer, []ssh.PublicKey, error) {
	keyPEM, err := os.ReadFile(proto.HostKeyPath)
	if err != nil {
		return nil, nil, fmt.Errorf("read the SSH host key: %w", err)
	}
	hostKey, err := ssh.ParsePrivateKey(keyPEM)
	if err != nil {
		return nil, nil, fmt.Errorf("parse the SSH host key %s: %w", proto.HostKeyPath, err)
	}
	var authorized []ssh.PublicKey
	for i, line := range bc.AuthorizedKeys {
		k, _, _, _, err := ssh.ParseAuthorizedKey([]byte(line))
		if err != nil {
			return nil, nil, fmt.Errorf("parse authorized key %d of the boot data: %w", i+1, err)
		}
		authorized = append(authorized, k)
	}
	return hostKey, authorized, nil
}

// serveVirtioSerial serves one SSH connection at a time over the named
// virtio-serial port, reopening it each time the host disconnects.
func serveVirtioSerial(ctx context.Context, log *slog.Logger, srv *Server, name string) error {
	dev, err := findPort(name, 10*time.Second)
	if err != nil {
		return err
	}
	log.Info("serving the control channel", "port", dev, "uptime", uptime().Round(time.Millisecond))
	for ctx.Err() == nil {
		f, err := openPort(ctx, dev)
		if err != nil {
			return err
		}
		// Wait until the host side is connected (a read on a port whose
		// host side is closed returns EOF at once), then say we are ready.
		if err := waitHostConnected(ctx, f); err != nil {
			f.Close()
			return err
		}
		if err := srv.ServeConn(ctx, &fileConn{f: f}); err != nil {
			log.Debug("control connection ended", "err", err)
		}
	}
	return nil
}

// openPort opens the control port. The driver allows one open at a time
// and answers EBUSY while the previous one is still being released, so
// that is retried for a while rather than ending the agent (which would
// power the VM off).
func openPort(ctx context.Context, dev string) (*os.File, error) {
	deadline := time.Now().Add(10 * time.Second)
	for {
		f, err := os.OpenFile(dev, os.O_RDWR|unix.O_NOCTTY, 0)
		if err == nil {
			return f, nil
		}
		if !errors.Is(err, unix.EBUSY) || time.Now().After(deadline) {
			return nil, fmt.Errorf("open control port %s: %w", dev, err)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// findPort returns the /dev node of the virtio-serial port called name.
func findPort(name string, wait time.Duration) (string, error) {
	deadline := time.Now().Add(wait)
	for {
		matches, _ := filepath.Glob("/sys/class/virtio-ports/*/name")
		for _, m := range matches {
			b, err := os.ReadFile(m)
			if err == nil && strings.TrimSpace(string(b)) == name {
				dev := "/dev/" + filepath.Base(filepath.Dir(m))
				if _, err := os.Stat(dev); err == nil {
					return dev, nil
				}
			}
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("no virtio-serial port named %q appeared", name)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitHostConnected blocks until the host side of the port is connected:
// the port then stops reporting POLLHUP. It polls through SyscallConn, not
// f.Fd(): Fd would switch the file to blocking mode, and a read blocked in
// the kernel keeps the port open after Close (the next open then fails
// with EBUSY) and cannot be interrupted.
func waitHostConnected(ctx context.Context, f *os.File) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return fmt.Errorf("control port: %w", err)
	}
	for ctx.Err() == nil {
		var revents int16
		var perr error
		n := 0
		if err := rc.Control(func(fd uintptr) {
			fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
			n, perr = unix.Poll(fds, 100)
			revents = fds[0].Revents
		}); err != nil {
			return fmt.Errorf("poll control port: %w", err)
		}
		if perr != nil {
			if errors.Is(perr, unix.EINTR) {
				continue
			}
			return fmt.Errorf("poll control port: %w", perr)
		}
		if n == 0 || revents&unix.POLLHUP == 0 {
			return nil
		}
		time.Sleep(50 * time.Millisecond) // the host is not connected
	}
	return ctx.Err()
}

// serveVsock serves SSH connections on a vsock port.
func serveVsock(ctx context.Context, log *slog.Logger, srv *Server, port uint32) error {
	fd, err := unix.Socket(unix.AF_VSOCK, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("vsock socket: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrVM{CID: unix.VMADDR_CID_ANY, Port: port}); err != nil {
		unix.Close(fd)
		return fmt.Errorf("bind vsock port %d: %w", port, err)
	}
	if err := unix.Listen(fd, 16); err != nil {
		unix.Close(fd)
		return fmt.Errorf("listen on vsock port %d: %w", port, err)
	}
	go func() {
		<-ctx.Done()
		unix.Close(fd)
	}()
	log.Info("serving the control channel", "vsock_port", port, "uptime", uptime().Round(time.Millisecond))
	for ctx.Err() == nil {
		nfd, _, err := unix.Accept4(fd, unix.SOCK_CLOEXEC)
		if err != nil {
			if errors.Is(err, unix.EINTR) || errors.Is(err, unix.ECONNABORTED) {
				continue
			}
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("accept on vsock: %w", err)
		}
		go func() {
			f := os.NewFile(uintptr(nfd), "vsock")
			if err := srv.ServeConn(ctx, &fileConn{f: f}); err != nil {
				log.Debug("control connection ended", "err", err)
			}
		}()
	}
	return nil
}

// fileConn adapts a stream file (a virtio-serial port, a vsock socket) to
// net.Conn for the SSH server.
type fileConn struct{ f *os.File }

func (c *fileConn) Read(p []byte) (int, error)         { return c.f.Read(p) }
func (c *fileConn) Write(p []byte) (int, error)        { return c.f.Write(p) }
func (c *fileConn) Close() error                       { return c.f.Close() }
func (c *fileConn) LocalAddr() net.Addr                { return fileAddr(c.f.Name()) }
func (c *fileConn) RemoteAddr() net.Addr               { return fileAddr("host") }
func (c *fileConn) SetDeadline(t time.Time) error      { return nil }
func (c *fileConn) SetReadDeadline(t time.Time) error  { return nil }
func (c *fileConn) SetWriteDeadline(t time.Time) error { return nil }

type fileAddr string

func (a fileAddr) Network() string { return "file" }
func (a fileAddr) String() string  { return string(a) }
