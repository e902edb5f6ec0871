package mitmproxy

import (
	"github.com/vibedom/vibedom/netfilter/internal/mitmtest"
	"github.com/vibedom/vibedom/netfilter/internal/nftest"
	"github.com/vibedom/vibedom/netfilter/mitm"

	"path/filepath"
	"testing"

	"github.com/vibedom/vibedom/keys"
)

// mitmdumpProbe skips a test, mitmwebProbe a live-view test, with the
// reason, when no supported mitmdump (mitmweb) is installed.
var (
	mitmdumpProbe = nftest.VersionProbe("mitmproxy engine not tested", MitmdumpVersion)
	mitmwebProbe  = nftest.VersionProbe("live view not tested", MitmwebVersion, mitmdumpProbe)
)

// newEnv is the mitmproxy engine on the engines' shared harness, its
// configuration changed by mopt (when not nil) and opts.
func newEnv(t *testing.T, rules string, mopt func(*Config), opts ...func(*mitm.EngineConfig)) (*mitmtest.Env, *Engine) {
	t.Helper()
	mitmdumpProbe.Skip(t)
	v := mitmtest.New(t, rules)
	cfg := v.Config()
	for _, o := range opts {
		o(&cfg)
	}
	mcfg := Config{EngineConfig: cfg, CAKeyFile: filepath.Join(v.Dir, "ca", keys.CAKeyFile), RuntimeDir: v.Dir}
	if mopt != nil {
		mopt(&mcfg)
	}
	m, err := NewEngine(t.Context(), mcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	v.Eng, v.Guard = m, m.guard
	return v, m
}
