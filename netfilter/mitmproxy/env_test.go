package mitmproxy

import (
	"github.com/vibedom/vibedom/netfilter/internal/mitmtest"
	"github.com/vibedom/vibedom/netfilter/internal/nftest"
	"github.com/vibedom/vibedom/netfilter/mitm"

	"context"
	"path/filepath"
	"testing"

	"github.com/vibedom/vibedom/keys"
)

// mitmdumpProbe and mitmwebProbe find a supported mitmdump and mitmweb.
var (
	mitmdumpProbe = nftest.NewProbe("mitmproxy engine not tested", func() error {
		_, err := MitmdumpVersion(context.Background(), "")
		return err
	})
	mitmwebProbe = nftest.NewProbe("live view not tested", func() error {
		_, err := MitmwebVersion(context.Background(), "")
		return err
	})
)

// skipWithoutMitmdump skips a test, with the reason, when no supported
// mitmdump is installed.
func skipWithoutMitmdump(t testing.TB) {
	t.Helper()
	mitmdumpProbe.Skip(t)
}

// skipWithoutMitmweb skips a live-view test, with the reason, when no
// supported mitmweb is installed.
func skipWithoutMitmweb(t testing.TB) {
	t.Helper()
	mitmdumpProbe.Skip(t)
	mitmwebProbe.Skip(t)
}

// newEnv is the mitmproxy engine on the engines' shared harness, its
// configuration changed by mopt (when not nil) and opts.
func newEnv(t *testing.T, rules string, mopt func(*Config), opts ...func(*mitm.EngineConfig)) (*mitmtest.Env, *Engine) {
	t.Helper()
	skipWithoutMitmdump(t)
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
