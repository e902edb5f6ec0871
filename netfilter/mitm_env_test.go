package netfilter

import (
	"github.com/vibedom/vibedom/netfilter/egress"
	"github.com/vibedom/vibedom/netfilter/internal/mitmtest"
	"github.com/vibedom/vibedom/netfilter/mitm"
	"github.com/vibedom/vibedom/netfilter/mitmproxy"

	"path/filepath"
	"testing"

	"github.com/vibedom/vibedom/keys"
)

// testEnv is an engine, the Go engine or the mitmproxy engine, on the
// engines' shared harness (mitmtest.Env), with its events written to the
// network logs as a session writes them.
type testEnv struct {
	*mitmtest.Env
	engine *mitm.GoEngine // the Go engine (nil for the mitmproxy engine)
	log    *LogWriter
	logDir string
}

type envOption func(*mitm.EngineConfig)

func newTestEnv(t *testing.T, rules string, opts ...envOption) *testEnv {
	t.Helper()
	return newEngineEnv(t, "go", rules, opts...)
}

// newEngineEnv is newTestEnv with the engine named: "go" or "mitmproxy"
// (skipped, with the reason, when mitmdump is missing).
func newEngineEnv(t *testing.T, kind, rules string, opts ...envOption) *testEnv {
	t.Helper()
	return newMitmEnv(t, kind, rules, nil, opts...)
}

// newMitmEnv is newEngineEnv with mopt, when not nil, changing the
// mitmproxy engine's own configuration.
func newMitmEnv(t *testing.T, kind, rules string, mopt func(*mitmproxy.Config), opts ...envOption) *testEnv {
	t.Helper()
	if kind == "mitmproxy" {
		mitmdumpProbe.Skip(t)
	}
	v := &testEnv{Env: mitmtest.New(t, rules)}
	v.logDir = v.Dir
	var err error
	v.log, err = NewLogWriter(filepath.Join(v.logDir, NetworkLogFile), filepath.Join(v.logDir, AlertsLogFile))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { v.log.Close() })
	cfg := v.Config()
	cfg.Events = egress.EventSinkFunc(func(e egress.Event) { v.log.Record(e); v.Events.Record(e) })
	for _, o := range opts {
		o(&cfg)
	}
	if kind == "mitmproxy" {
		mcfg := mitmproxy.Config{EngineConfig: cfg, CAKeyFile: filepath.Join(v.Dir, "ca", keys.CAKeyFile), RuntimeDir: v.Dir}
		if mopt != nil {
			mopt(&mcfg)
		}
		m, err := mitmproxy.NewEngine(t.Context(), mcfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Close() })
		v.Eng, v.Guard = m, m.Guard()
		return v
	}
	v.engine, err = mitm.NewGoEngine(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { v.engine.Close() })
	v.Eng, v.Guard = v.engine, v.engine.Guard()
	return v
}

// alerts flushes the log and returns the alerts.jsonl lines.
func (v *testEnv) alerts() []map[string]any {
	v.T().Helper()
	v.log.Close()
	return readJSONL(v.T(), filepath.Join(v.logDir, AlertsLogFile))
}
