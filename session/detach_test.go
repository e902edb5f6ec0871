package session

import (
	"encoding/json"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/vibedom/vibedom/home"
	nfegress "github.com/vibedom/vibedom/netfilter/egress"
	"github.com/vibedom/vibedom/policy"
	"github.com/vibedom/vibedom/preflight"
)

// hostDir makes an empty session folder as detach reserves it.
func hostDir(t *testing.T, name string) (home.Home, string) {
	t.Helper()
	h := home.Home(t.TempDir())
	dir := h.Session(name)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	return h, dir
}

// TestHostFileRoundTrip: what run --detach decided reaches the host as it
// was, and the file is gone once read.
func TestHostFileRoundTrip(t *testing.T) {
	h, dir := hostDir(t, "app-1234")
	o := Options{
		Home: h, Name: "app-1234", Workspace: t.TempDir(), CPUs: 3, MemoryMiB: 1024, Arch: "amd64",
		Agent: &AgentOptions{Name: "claude", Args: []string{"-p", "fix it"}}, AsRoot: true,
		Egress: EgressOptions{Allow: []string{"example.com"}, CAFiles: []string{"/ca.pem"}, ProxyEngine: "go",
			Resolve: []nfegress.Resolve{{Name: "api.example.com", Port: 443, Addr: netip.MustParseAddrPort("[::1]:8443")}}},
		DLP:       policy.DLPOptions{AllowPatterns: []string{"Pearl St"}, AllowContexts: []string{"internal_ips"}},
		Review:    ReviewOptions{Skip: true},
		SSHAgent:  SSHAgentOptions{Enabled: true},
		Preflight: PreflightOptions{Mode: preflight.ModeStrict},
	}
	scan := &scanResult{report: []byte("{\n  \"version\": 1\n}\n"), secrets: []string{"not in the file"}}
	if err := writeHostFile(dir, o, scan); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(dir, hostFileName))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("host file: %v, mode %v", err, fi.Mode())
	}
	raw, _ := os.ReadFile(filepath.Join(dir, hostFileName))
	if strings.Contains(string(raw), "not in the file") {
		t.Error("the preflight's secret values are in the host file")
	}
	got, err := readHostFile(dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, hostFileName)); !os.IsNotExist(err) {
		t.Errorf("the host file is still there after reading: %v", err)
	}
	if got.scanned == nil || string(got.scanned.report) != string(scan.report) {
		t.Errorf("report = %+v, want %q", got.scanned, scan.report)
	}
	want := o
	want.reserved, want.scanned = true, got.scanned
	if !reflect.DeepEqual(got, want) {
		t.Errorf("read back\n%+v\nwant\n%+v", got, want)
	}
}

// TestHostFileRefused: the host checks its options as the flags were
// checked, and reads nothing it does not know, nothing too large, and
// nothing outside a session folder.
func TestHostFileRefused(t *testing.T) {
	good := func() map[string]any {
		return map[string]any{"version": 1, "name": "app-1", "workspace": "/w", "cpus": 2, "memory_mib": 2048,
			"arch": "amd64", "egress": map[string]any{"proxy_engine": "go"}, "dlp": map[string]any{},
			"review": map[string]any{}, "preflight": "off"}
	}
	tests := []struct {
		name string
		edit func(m map[string]any)
		raw  []byte
		want string
	}{
		{"unknown field", func(m map[string]any) { m["env"] = map[string]any{"X": "1"} }, nil, "unknown field"},
		{"other name", func(m map[string]any) { m["name"] = "other" }, nil, "folder"},
		{"version", func(m map[string]any) { m["version"] = 2 }, nil, "version"},
		{"cpus", func(m map[string]any) { m["cpus"] = 1000 }, nil, "--cpus"},
		{"arch", func(m map[string]any) { m["arch"] = "mips" }, nil, "--arch"},
		{"engine", func(m map[string]any) { m["egress"] = map[string]any{"proxy_engine": "curl"} }, nil, "--proxy-engine"},
		{"resolve", func(m map[string]any) {
			m["egress"] = map[string]any{"proxy_engine": "go", "resolve": []string{"x"}}
		}, nil, "--resolve"},
		{"agent", func(m map[string]any) { m["agent"] = map[string]any{"Name": "rm -rf"} }, nil, "--agent"},
		{"preflight", func(m map[string]any) { m["preflight"] = "maybe" }, nil, "preflight"},
		{"no report", func(m map[string]any) { m["preflight"] = "warn" }, nil, "no preflight report"},
		{"trailing", nil, []byte(`{"version":1} {}`), ""},
		{"too large", nil, []byte(`{"version":1,"name":"` + strings.Repeat("a", maxHostFile) + `"}`), ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, dir := hostDir(t, "app-1")
			b := tt.raw
			if b == nil {
				m := good()
				tt.edit(m)
				b, _ = json.Marshal(m)
			}
			if err := os.WriteFile(filepath.Join(dir, hostFileName), b, 0o600); err != nil {
				t.Fatal(err)
			}
			_, err := readHostFile(dir)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("err = %v, want one about %q", err, tt.want)
			}
		})
	}
	t.Run("good", func(t *testing.T) {
		_, dir := hostDir(t, "app-1")
		b, _ := json.Marshal(good())
		os.WriteFile(filepath.Join(dir, hostFileName), b, 0o600)
		if _, err := readHostFile(dir); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("not a session folder", func(t *testing.T) {
		dir := t.TempDir()
		b, _ := json.Marshal(good())
		os.WriteFile(filepath.Join(dir, hostFileName), b, 0o600)
		if _, err := readHostFile(dir); err == nil || !strings.Contains(err.Error(), "not a session folder") {
			t.Errorf("err = %v", err)
		}
	})
	t.Run("symlink", func(t *testing.T) {
		_, dir := hostDir(t, "app-1")
		other := filepath.Join(t.TempDir(), "x.json")
		b, _ := json.Marshal(good())
		os.WriteFile(other, b, 0o600)
		os.Symlink(other, filepath.Join(dir, hostFileName))
		if _, err := readHostFile(dir); err == nil || !strings.Contains(err.Error(), "regular file") {
			t.Errorf("err = %v", err)
		}
	})
}
