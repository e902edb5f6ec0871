package netfilter

import (
	"github.com/vibedom/vibedom/netfilter/egress"
	"github.com/vibedom/vibedom/netfilter/internal/mitmtest"
	"github.com/vibedom/vibedom/netfilter/mitm"

	"strings"
	"testing"
	"time"
)

// TestConformanceServerFirst: a protocol whose server speaks first (SSH,
// SMTP) works on a port other than 80 and 443 on both engines. mitmdump
// waits for the client's first bytes to choose a layer, so before the
// mitmproxy engine spliced a silent guest, `git push` over SSH hung there.
func TestConformanceServerFirst(t *testing.T) {
	t.Parallel()
	forEngines(t, func(t *testing.T, kind string) {
		v := newEngineEnv(t, kind, mitmtest.Rules, func(c *mitm.EngineConfig) { c.ServerFirstWait = 100 * time.Millisecond })
		v.AddServer("ssh.test", 22, mitmtest.ServerFirstEcho(t))
		conn := v.GuestConn("ssh.test", 22)
		defer conn.Close()
		conn.SetDeadline(time.Now().Add(time.Minute))
		mitmtest.TalkServerFirst(t, conn)
		ev := v.Events.Wait(t, "splice connect", func(e egress.Event) bool { return e.Kind == "connect" && e.Name == "ssh.test" })
		if ev.Decision != "allow" || !strings.Contains(ev.Reason, "server speaks first") {
			t.Errorf("event: %+v", ev)
		}
	})
}
