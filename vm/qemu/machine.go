package qemu

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/vibedom/vibedom/childenv"
	"github.com/vibedom/vibedom/vm"
)

var timeZero time.Time

// machine is one QEMU process.
type machine struct {
	cfg     vm.Config
	plan    *plan
	cmd     *exec.Cmd
	qmp     *qmp
	log     *slog.Logger
	stderr  *boundedBuffer
	exited  chan struct{} // closed when the process has been reaped
	daemons []*daemon     // virtiofsd processes, stopped after QEMU
	waitErr error         // set before exited is closed

	mu       sync.Mutex
	state    vm.State
	reason   string // SHUTDOWN event reason
	killed   bool
	subs     []chan vm.State
	final    bool
	dialling sync.Mutex
}

// A QEMU machine does not implement vm.StateSaver, on purpose: QEMU 7.2
// (Debian bookworm) refuses to migrate, and so to save, a machine with a
// vhost-user-fs device ("State blocked by non-migratable device
// '…/vhost-user-fs'", from the moment it exists; its virtiofsd has no
// migration option) or with a 9p export the guest has mounted, and every
// vibedom session shares its workspace one of these two ways.
// vm.SaveStateSupported answers with vm.ErrSaveUnsupported; docs/vm.md has
// the details.
var (
	_ vm.Machine   = (*machine)(nil)
	_ vm.Pauser    = (*machine)(nil)
	_ vm.Ballooner = (*machine)(nil)
)

func start(ctx context.Context, p *plan, cfg *vm.Config, log *slog.Logger) (*machine, error) {
	for _, s := range []string{p.qmpSock, p.controlSoc} {
		_ = os.Remove(s)
	}
	m := &machine{cfg: *cfg, plan: p, log: log, state: vm.StateStarting, exited: make(chan struct{}),
		stderr: &boundedBuffer{max: 16 << 10}}
	for i, s := range p.virtiofs {
		d, err := startVirtiofsd(ctx, s, p.virtiofsSock(i))
		if err != nil {
			m.stopDaemons()
			return nil, err
		}
		m.daemons = append(m.daemons, d)
	}
	cmd := exec.Command(p.bin, p.args...)
	cmd.Env = childenv.Environ() // no API key in qemu's /proc/PID/environ
	cmd.Stdin = nil
	cmd.Stdout = io.Discard
	cmd.Stderr = m.stderr
	cmd.ExtraFiles = p.extra
	cmd.SysProcAttr = procAttr()
	if err := cmd.Start(); err != nil {
		m.stopDaemons()
		return nil, fmt.Errorf("start %s: %w", p.bin, err)
	}
	m.cmd = cmd
	go func() {
		err := cmd.Wait()
		m.mu.Lock()
		m.waitErr = err
		m.mu.Unlock()
		m.stopDaemons()
		m.cleanupSockets()
		// The final state before exited closes: whoever Wait releases
		// must see it.
		m.setFinal()
		close(m.exited)
	}()

	// Connect QMP: the socket appears once QEMU has parsed its options.
	var conn net.Conn
	for i := 0; ; i++ {
		c, err := net.Dial("unix", p.qmpSock)
		if err == nil {
			conn = c
			break
		}
		select {
		case <-m.exited:
			return nil, m.startError()
		case <-ctx.Done():
			_ = m.Kill()
			return nil, fmt.Errorf("start qemu: %w", ctx.Err())
		case <-time.After(min(vm.Backoff(i), 50*time.Millisecond)):
		}
	}
	qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	q, err := dialQMP(qctx, conn, m.event)
	if err != nil {
		conn.Close()
		_ = m.Kill()
		select {
		case <-m.exited:
			return nil, m.startError()
		case <-time.After(time.Second):
		}
		return nil, fmt.Errorf("start qemu: %w", err)
	}
	m.qmp = q
	m.setState(vm.StateRunning)
	return m, nil
}

func (m *machine) startError() error {
	msg := strings.TrimSpace(m.stderr.String())
	if msg == "" {
		msg = "no output"
	}
	return fmt.Errorf("qemu exited at start (%v): %s", m.waitErr, msg)
}

// event handles QMP events.
func (m *machine) event(name string, data json.RawMessage) {
	switch name {
	case "STOP":
		m.mu.Lock()
		shutting := m.state == vm.StateStopping
		m.mu.Unlock()
		if !shutting {
			m.setState(vm.StatePaused)
		}
	case "RESUME":
		m.setState(vm.StateRunning)
	case "SHUTDOWN":
		var d struct {
			Reason string `json:"reason"`
		}
		_ = json.Unmarshal(data, &d)
		m.mu.Lock()
		m.reason = d.Reason
		m.mu.Unlock()
		m.setState(vm.StateStopping)
	case "POWERDOWN":
		m.setState(vm.StateStopping)
	}
}

func (m *machine) setState(s vm.State) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.final || m.state == s {
		return
	}
	m.state = s
	for _, c := range m.subs {
		sendLatest(c, s)
	}
}

// setFinal records how the process ended and closes the subscriptions.
func (m *machine) setFinal() {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := vm.StateStopped
	if m.exitError() != nil {
		s = vm.StateError
	}
	m.state = s
	m.final = true
	for _, c := range m.subs {
		sendLatest(c, s)
		close(c)
	}
	m.subs = nil
}

// sendLatest delivers s; a reader more than 16 states behind loses the
// oldest ones, never the newest.
func sendLatest(c chan vm.State, s vm.State) {
	select {
	case c <- s:
	default:
		select {
		case <-c:
		default:
		}
		c <- s
	}
}

// exitError says why the machine ended; nil for a clean guest power-off.
// Called with mu held.
func (m *machine) exitError() error {
	if m.killed {
		return errors.New("the VM was stopped forcefully")
	}
	if m.waitErr != nil {
		return fmt.Errorf("qemu: %v%s", m.waitErr, m.consoleTail())
	}
	switch m.reason {
	case "guest-shutdown", "host-qmp-system-powerdown":
		return nil
	case "":
		return nil // exited 0 without an event: QEMU only does that on guest power-off with -no-reboot
	case "guest-reset", "guest-panic":
		return fmt.Errorf("the guest crashed or rebooted (%s)%s", m.reason, m.consoleTail())
	default:
		return fmt.Errorf("the VM shut down: %s%s", m.reason, m.consoleTail())
	}
}

func (m *machine) consoleTail() string {
	if m.cfg.ConsoleLog == "" {
		return ""
	}
	data, err := os.ReadFile(m.cfg.ConsoleLog)
	if err != nil || len(data) == 0 {
		return ""
	}
	if len(data) > 4096 {
		data = data[len(data)-4096:]
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > 10 {
		lines = lines[len(lines)-10:]
	}
	return "; console:\n" + strings.Join(lines, "\n")
}

// State implements vm.Machine.
func (m *machine) State() vm.State {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.state
}

// StateChanges implements vm.Machine.
func (m *machine) StateChanges() <-chan vm.State {
	m.mu.Lock()
	defer m.mu.Unlock()
	c := make(chan vm.State, 16)
	if m.final {
		c <- m.state
		close(c)
		return c
	}
	m.subs = append(m.subs, c)
	return c
}

// Wait implements vm.Machine.
func (m *machine) Wait(ctx context.Context) error {
	select {
	case <-m.exited:
		m.mu.Lock()
		defer m.mu.Unlock()
		return m.exitError()
	case <-ctx.Done():
		return ctx.Err()
	}
}

// DialControl implements vm.Machine. The control channel is one stream:
// a second dial waits until the first connection is closed.
func (m *machine) DialControl(ctx context.Context) (net.Conn, error) {
	for i := 0; ; i++ {
		select {
		case <-m.exited:
			return nil, fmt.Errorf("dial control channel: %w", vm.ErrNotRunning)
		default:
		}
		c, err := net.Dial("unix", m.plan.controlSoc)
		if err == nil {
			return c, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("dial control channel: %w (last error: %v)", ctx.Err(), err)
		case <-m.exited:
		case <-time.After(vm.Backoff(i)):
		}
	}
}

// Pause implements vm.Pauser.
func (m *machine) Pause(ctx context.Context) error {
	if err := m.running(); err != nil {
		return err
	}
	if _, err := m.qmp.execute(ctx, "stop", nil); err != nil {
		return err
	}
	m.setState(vm.StatePaused)
	return nil
}

// Resume implements vm.Pauser.
func (m *machine) Resume(ctx context.Context) error {
	if err := m.running(); err != nil {
		return err
	}
	if _, err := m.qmp.execute(ctx, "cont", nil); err != nil {
		return err
	}
	m.setState(vm.StateRunning)
	return nil
}

// SetMemoryTarget implements vm.Ballooner with QMP's balloon command, whose
// value is the guest's logical memory size in bytes. QEMU fails it while
// the guest has not loaded its balloon driver.
func (m *machine) SetMemoryTarget(ctx context.Context, mib int) error {
	if err := m.running(); err != nil {
		return fmt.Errorf("set the balloon target: %w", err)
	}
	mib = min(max(mib, 1), m.cfg.MemoryMiB)
	if _, err := m.qmp.execute(ctx, "balloon", struct {
		Value int64 `json:"value"`
	}{int64(mib) << 20}); err != nil {
		return fmt.Errorf("set the balloon target to %d MiB: %w", mib, err)
	}
	return nil
}

// MemoryTarget implements vm.Ballooner with QMP's query-balloon: the size
// the guest has reached.
func (m *machine) MemoryTarget(ctx context.Context) (int, error) {
	if err := m.running(); err != nil {
		return 0, fmt.Errorf("query the balloon: %w", err)
	}
	ret, err := m.qmp.execute(ctx, "query-balloon", nil)
	if err != nil {
		return 0, fmt.Errorf("query the balloon: %w", err)
	}
	var info struct {
		Actual *int64 `json:"actual"`
	}
	if err := json.Unmarshal(ret, &info); err != nil || info.Actual == nil || *info.Actual < 0 {
		return 0, fmt.Errorf("query the balloon: unexpected answer %.200q", ret)
	}
	return int(*info.Actual >> 20), nil
}

func (m *machine) running() error {
	select {
	case <-m.exited:
		return vm.ErrNotRunning
	default:
		return nil
	}
}

// Stop implements vm.Machine: the ACPI power button, then QMP quit when ctx
// ends, then SIGKILL.
func (m *machine) Stop(ctx context.Context) error {
	if m.running() != nil {
		return nil
	}
	m.mu.Lock()
	paused := m.state == vm.StatePaused
	m.mu.Unlock()
	if paused {
		_, _ = m.qmp.execute(ctx, "cont", nil)
	}
	if _, err := m.qmp.execute(ctx, "system_powerdown", nil); err == nil {
		select {
		case <-m.exited:
			return nil
		case <-ctx.Done():
		}
	}
	m.mu.Lock()
	m.killed = true
	m.mu.Unlock()
	qctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, _ = m.qmp.execute(qctx, "quit", nil)
	select {
	case <-m.exited:
		return nil
	case <-time.After(3 * time.Second):
	}
	return m.Kill()
}

// Kill implements vm.Machine.
func (m *machine) Kill() error {
	if m.running() != nil {
		return nil
	}
	m.mu.Lock()
	m.killed = true
	m.mu.Unlock()
	_ = syscall.Kill(-m.cmd.Process.Pid, syscall.SIGKILL)
	select {
	case <-m.exited:
		return nil
	case <-time.After(10 * time.Second):
		return errors.New("qemu did not die after SIGKILL")
	}
}

// stopDaemons ends the virtiofsd processes. Each exits by itself once QEMU
// has gone; the kill is for the failures before QEMU connected.
func (m *machine) stopDaemons() {
	for _, d := range m.daemons {
		d.stop()
	}
}

func (m *machine) cleanupSockets() {
	_ = os.Remove(m.plan.qmpSock)
	_ = os.Remove(m.plan.controlSoc)
}

// boundedBuffer keeps the first max bytes written to it.
type boundedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
	max int
}

func (b *boundedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if room := b.max - b.buf.Len(); room > 0 {
		b.buf.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

func (b *boundedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
