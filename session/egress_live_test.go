package session

import (
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vibedom/vibedom/home"
	"github.com/vibedom/vibedom/netfilter"
	nfegress "github.com/vibedom/vibedom/netfilter/egress"
	"github.com/vibedom/vibedom/policy"
	"github.com/vibedom/vibedom/wstrust"
)

// liveHost is a session host with a control socket and an egress policy
// (no VM, no network stack): the user file holds userRules.
func liveHost(t *testing.T, userRules string) *sess {
	t.Helper()
	s := controlHost(t, os.Getuid())
	s.opts.Home = home.Home(t.TempDir())
	if userRules != "" {
		os.WriteFile(s.opts.Home.TrustedDomains(), []byte(userRules), 0o644)
	}
	pol, _, err := policy.EgressPolicy(s.opts.Home, &wstrust.Trust{}, []string{"flag.example"})
	if err != nil {
		t.Fatal(err)
	}
	s.logDir = t.TempDir()
	events, err := netfilter.NewLogWriter(filepath.Join(s.logDir, netfilter.NetworkLogFile), filepath.Join(s.logDir, netfilter.AlertsLogFile))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { events.Close() })
	s.egress = &egress{policy: pol, live: newLivePolicy(s.opts.Home, pol, time.Now()), conns: newConnSet(), events: events}
	return s
}

// egressAsk sends req through the control socket, as the CLI does.
func egressAsk(t *testing.T, s *sess, req EgressRequest) (*EgressReply, error) {
	t.Helper()
	conn, err := DialControl(&Info{State: s.snapshotState(), Live: StatusRunning, Dir: s.dir})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	rep, err := conn.Do(ControlRequest{Op: OpEgress, Egress: &req}, 10*time.Second)
	if err != nil {
		return nil, err
	}
	return rep.Egress, nil
}

func TestLiveAllowDenyOverControl(t *testing.T) {
	s := liveHost(t, "# mine\nuser.example\n")
	limited := nfegress.LimitWildcards(s.egress.live) // what the stack and the proxy ask
	if d := limited.Decide("new.example", 443); d.Allow {
		t.Fatalf("new.example allowed before any live rule: %+v", d)
	}
	rep, err := egressAsk(t, s, EgressRequest{Action: EgressAllow, Rules: []string{"new.example", "*.wild.example:8443"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Rules) != 2 || rep.Rules[0].Scope != scopeSession || !rep.Rules[0].Live {
		t.Errorf("allow reply %+v", rep.Rules)
	}
	for _, c := range []struct {
		name string
		port uint16
		want bool
	}{{"new.example", 443, true}, {"new.example", 22, false}, {"a.wild.example", 8443, true}, {"wild.example", 8443, false}} {
		if d := limited.Decide(c.name, c.port); d.Allow != c.want {
			t.Errorf("%s:%d after allow: %+v, want allow=%v", c.name, c.port, d, c.want)
		}
	}
	if d := limited.DecideName("new.example"); !d.Allow {
		t.Errorf("DNS for new.example after allow: %+v", d)
	}

	// An open connection to the name, and one elsewhere: deny closes the
	// first only.
	hit, hitPeer := net.Pipe()
	miss, missPeer := net.Pipe()
	defer hitPeer.Close()
	defer missPeer.Close()
	s.egress.conns.add(netfilter.Target{Name: "new.example", Port: 443}, hit)
	s.egress.conns.add(netfilter.Target{Name: "user.example", Port: 443}, miss)
	rep, err = egressAsk(t, s, EgressRequest{Action: EgressDeny, Rules: []string{"new.example"}})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Closed != 1 || len(rep.Rules) != 1 || rep.Rules[0].Rule != "!new.example" {
		t.Errorf("deny reply %+v", rep)
	}
	if _, err := hitPeer.Write([]byte("x")); err == nil {
		t.Error("the connection to the denied name is still open")
	}
	go missPeer.Write([]byte("x"))
	miss.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := miss.Read(make([]byte, 1)); err != nil {
		t.Errorf("a connection to another name was closed: %v", err)
	}
	if d := limited.Decide("new.example", 443); d.Allow {
		t.Errorf("new.example allowed after deny: %+v", d)
	}

	// show: every rule with its scope; check: the deciding rule.
	rep, err = egressAsk(t, s, EgressRequest{Action: EgressShow})
	if err != nil {
		t.Fatal(err)
	}
	scopes := map[string]string{}
	for _, r := range rep.Rules {
		scopes[r.Rule] = r.Scope
	}
	for rule, want := range map[string]string{"api.anthropic.com:443": scopeBuiltin, "user.example": scopeUser,
		"flag.example": scopeSession, "new.example": scopeSession, "!new.example": scopeSession} {
		if scopes[rule] != want {
			t.Errorf("show: %s has scope %q, want %q (all: %v)", rule, scopes[rule], want, scopes)
		}
	}
	rep, err = egressAsk(t, s, EgressRequest{Action: EgressCheck, Name: "NEW.example.", Port: 443})
	if err != nil {
		t.Fatal(err)
	}
	if c := rep.Check; c == nil || c.Allow || c.Rule != "!new.example" || c.Scope != scopeSession || c.Since.IsZero() || c.Name != "new.example" {
		t.Errorf("check: %+v", rep.Check)
	}
	s.egress.events.Close() // flushes network.jsonl
	log, _ := os.ReadFile(filepath.Join(s.logDir, netfilter.NetworkLogFile))
	for _, want := range []string{`"kind":"policy"`, `"rule":"*.wild.example:8443"`, `"rule":"!new.example"`, "session scope"} {
		if !strings.Contains(string(log), want) {
			t.Errorf("network.jsonl has no %s for the live changes:\n%s", want, log)
		}
	}
}

// TestLiveRuleRefusals: bad or guarded rules change nothing and say why.
func TestLiveRuleRefusals(t *testing.T) {
	own := ""
	if as, err := net.InterfaceAddrs(); err == nil {
		for _, a := range as {
			if p, err := netip.ParsePrefix(a.String()); err == nil && p.Addr().Is4() && !p.Addr().IsLoopback() && !p.Addr().IsPrivate() {
				own = p.Addr().String()
			}
		}
	}
	cases := []struct {
		action string
		rules  []string
		want   string
	}{
		{EgressAllow, []string{"127.0.0.1"}, "never connects to"},
		{EgressAllow, []string{"0.0.0.0:*"}, "never connects to"},
		{EgressAllow, []string{"169.254.169.254:80"}, "never connects to"},
		{EgressAllow, []string{"[::1]:443"}, "never connects to"},
		{EgressAllow, []string{"[::ffff:127.0.0.1]:443"}, "never connects to"},
		{EgressAllow, []string{"10.1.2.3"}, "allow-private"},
		{EgressAllow, []string{"localhost"}, "host-local"},
		{EgressAllow, []string{"*.svc.localhost"}, "host-local"},
		{EgressAllow, []string{"metadata.google.internal"}, "host-local"},
		{EgressAllow, []string{"allow-private 10.0.0.0/8"}, "not taken live"},
		{EgressAllow, []string{"*.com"}, "at least two labels"},
		{EgressAllow, []string{"https://example.com"}, "without a scheme"},
		{EgressAllow, []string{"!example.com"}, "vibedom deny"},
		{EgressAllow, []string{"ok.example", "bad rule"}, "whitespace"},
		{EgressAllow, nil, "no rule given"},
		{EgressAllow, []string{"denied.example"}, "still be denied"},
		{EgressAllow, []string{"x.denied-wild.example"}, "still be denied"},
		{EgressDeny, []string{"exa mple.com"}, "whitespace"},
	}
	if own != "" {
		cases = append(cases, struct {
			action string
			rules  []string
			want   string
		}{EgressAllow, []string{own}, "host's own"})
	}
	for _, c := range cases {
		t.Run(c.action+" "+strings.Join(c.rules, " "), func(t *testing.T) {
			user := "# keep\n!denied.example\n!*.denied-wild.example\n"
			s := liveHost(t, user)
			before := s.egress.live.show()
			_, err := egressAsk(t, s, EgressRequest{Action: c.action, Rules: c.rules, Save: true})
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want an error with %q", err, c.want)
			}
			if strings.Contains(err.Error(), "\n") {
				t.Errorf("the error is not one line: %q", err)
			}
			if after := s.egress.live.show(); len(after) != len(before) {
				t.Errorf("the policy changed: %d rules, then %d", len(before), len(after))
			}
			if b, _ := os.ReadFile(s.opts.Home.TrustedDomains()); string(b) != user {
				t.Errorf("the user file changed:\n%s", b)
			}
			if d := s.egress.live.Decide("ok.example", 443); d.Allow {
				t.Error("the good rule of a refused batch took effect")
			}
		})
	}
}

func TestLiveAllowSave(t *testing.T) {
	user := "# my rules\r\nuser.example # a comment\nlast.example"
	s := liveHost(t, user)
	rep, err := egressAsk(t, s, EgressRequest{Action: EgressAllow, Rules: []string{"saved.example:8443"}, Save: true})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Saved != s.opts.Home.TrustedDomains() || rep.Rules[0].Scope != scopeUser {
		t.Errorf("reply %+v", rep)
	}
	b, _ := os.ReadFile(s.opts.Home.TrustedDomains())
	if !strings.HasPrefix(string(b), user+"\nsaved.example:8443  # added by `vibedom allow --save` in session t, ") {
		t.Errorf("user file after --save:\n%s", b)
	}
	if fi, _ := os.Stat(s.opts.Home.TrustedDomains()); fi.Mode().Perm() != 0o644 {
		t.Errorf("mode %v, want the file's own 0644", fi.Mode().Perm())
	}
	if _, err := nfegress.LoadPolicy(nfegress.PolicyConfig{UserFile: s.opts.Home.TrustedDomains()}); err != nil {
		t.Errorf("the saved file does not load: %v", err)
	}
	if d := s.egress.live.Decide("saved.example", 8443); !d.Allow {
		t.Errorf("saved.example:8443 not allowed: %+v", d)
	}
	// A user file that no longer loads is not written to, and nothing
	// changes.
	os.WriteFile(s.opts.Home.TrustedDomains(), []byte("*.com\n"), 0o644)
	if _, err := egressAsk(t, s, EgressRequest{Action: EgressAllow, Rules: []string{"other.example"}, Save: true}); err == nil || !strings.Contains(err.Error(), "nothing changed") {
		t.Errorf("save into a broken file: %v", err)
	}
	if d := s.egress.live.Decide("other.example", 443); d.Allow {
		t.Error("the rule took effect although saving it failed")
	}
}

// TestLivePolicyConcurrent: decisions made while rules change see either
// the old or the new policy, never a torn one (run with -race).
func TestLivePolicyConcurrent(t *testing.T) {
	s := liveHost(t, "")
	base := len(s.egress.live.show())
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				s.egress.live.Decide("c.example", 443)
				s.egress.live.DecideName("c.example")
			}
		}()
	}
	for i := range 20 {
		rules := []string{"c.example"}
		action := EgressAllow
		if i%2 == 1 {
			action = EgressDeny
			rules = []string{"c.example:22"}
		}
		if _, err := egressAsk(t, s, EgressRequest{Action: action, Rules: rules}); err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	wg.Wait()
	if n := len(s.egress.live.show()); n != base+20 {
		t.Errorf("%d rules after 20 changes", n)
	}
}

// TestNoMITMRefusesProviders: --no-mitm never covers a model provider's
// host (a credential is swapped there), an IP, a wildcard or a local name.
func TestNoMITMRefusesProviders(t *testing.T) {
	s := liveHost(t, "")
	for _, bad := range []string{"api.anthropic.com", "API.OpenAI.com.", "generativelanguage.googleapis.com", "chatgpt.com", "auth.openai.com", "platform.claude.com", "*.example.com", "192.0.2.7", "localhost", "pinned.example:443", "https://pinned.example"} {
		if _, err := s.checkNoMITM([]string{"ok.example", bad}); err == nil || strings.Contains(err.Error(), "\n") {
			t.Errorf("--no-mitm %s: %v", bad, err)
		}
	}
	got, err := s.checkNoMITM([]string{"Pinned.Example."})
	if err != nil || len(got) != 1 || got[0] != "pinned.example" {
		t.Errorf("--no-mitm Pinned.Example.: %v %v", got, err)
	}
}

// TestLiveWildcardBudget: a live wildcard rule keeps the DNS wildcard
// guard's budget of new names.
func TestLiveWildcardBudget(t *testing.T) {
	s := liveHost(t, "")
	limited := nfegress.LimitWildcards(s.egress.live)
	if _, err := egressAsk(t, s, EgressRequest{Action: EgressAllow, Rules: []string{"*.w.example"}}); err != nil {
		t.Fatal(err)
	}
	refused := 0
	for i := range 100 {
		if d := limited.DecideName("n" + strconv.Itoa(i) + ".w.example"); !d.Allow {
			refused++
			if !strings.Contains(d.Reason, "DNS exfiltration") {
				t.Fatalf("refused for another reason: %+v", d)
			}
		}
	}
	if refused == 0 {
		t.Error("100 new names under a live wildcard at once: none refused")
	}
}

// BenchmarkLiveDecide compares a decision through the live snapshot with
// one on the loaded policy itself: the snapshot costs one atomic load.
func BenchmarkLiveDecide(b *testing.B) {
	pol, _, err := policy.EgressPolicy(home.Home(b.TempDir()), &wstrust.Trust{}, []string{"a.example", "*.w.example"})
	if err != nil {
		b.Fatal(err)
	}
	l := newLivePolicy(home.Home(b.TempDir()), pol, time.Now())
	b.Run("policy", func(b *testing.B) {
		for b.Loop() {
			pol.Decide("x.w.example", 443)
		}
	})
	b.Run("live", func(b *testing.B) {
		for b.Loop() {
			l.Decide("x.w.example", 443)
		}
	})
}
