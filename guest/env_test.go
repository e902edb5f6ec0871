package guest

import (
	"slices"
	"strings"
	"testing"

	"github.com/vibedom/vibedom/guest/proto"
)

func TestSessionEnv(t *testing.T) {
	t.Parallel()
	network := &proto.Network{Interface: "eth0", ProxyURL: "http://10.254.254.1:3128", NoProxy: "localhost,127.0.0.1"}
	tests := []struct {
		name    string
		bc      proto.BootConfig
		ca      string
		want    []string // entries that must be present
		wantNot []string // names that must be absent
	}{
		{
			name:    "no network",
			bc:      proto.BootConfig{},
			ca:      CAPath,
			want:    []string{"HOME=/root", "LANG=C.UTF-8", "PATH=" + defaultPath, "USER=root"},
			wantNot: []string{"HTTP_PROXY", "https_proxy", "SSL_CERT_FILE", "NO_PROXY"},
		},
		{
			name: "network with a proxy and a CA",
			bc:   proto.BootConfig{Network: network},
			ca:   CAPath,
			want: []string{
				"HTTP_PROXY=http://10.254.254.1:3128", "HTTPS_PROXY=http://10.254.254.1:3128",
				"http_proxy=http://10.254.254.1:3128", "https_proxy=http://10.254.254.1:3128",
				"NO_PROXY=localhost,127.0.0.1", "no_proxy=localhost,127.0.0.1",
				"SSL_CERT_FILE=" + CAPath, "NODE_EXTRA_CA_CERTS=" + CAPath, "REQUESTS_CA_BUNDLE=" + CAPath,
				"CURL_CA_BUNDLE=" + CAPath, "GIT_SSL_CAINFO=" + CAPath,
			},
		},
		{
			name:    "network without a CA",
			bc:      proto.BootConfig{Network: &proto.Network{Interface: "eth0"}},
			ca:      "",
			wantNot: []string{"SSL_CERT_FILE", "NODE_EXTRA_CA_CERTS", "HTTP_PROXY", "NO_PROXY"},
		},
		{
			name: "boot data variables win",
			bc:   proto.BootConfig{Network: network, Env: map[string]string{"LANG": "de_DE.UTF-8", "HTTPS_PROXY": "", "EDITOR": "vi"}},
			ca:   CAPath,
			want: []string{"LANG=de_DE.UTF-8", "HTTPS_PROXY=", "EDITOR=vi"},
		},
		{
			name:    "invalid boot data names are dropped",
			bc:      proto.BootConfig{Env: map[string]string{"A=B": "x", "X; reboot": "y", "NUL": "a\x00b", "OK": "1"}},
			want:    []string{"OK=1"},
			wantNot: []string{"A", "X; reboot", "NUL"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := SessionEnv(&tt.bc, tt.ca)
			if !slices.IsSorted(env) {
				t.Errorf("environment not sorted: %q", env)
			}
			for _, w := range tt.want {
				if !slices.Contains(env, w) {
					t.Errorf("missing %q in %q", w, env)
				}
			}
			for _, n := range tt.wantNot {
				for _, kv := range env {
					if strings.HasPrefix(kv, n+"=") {
						t.Errorf("unexpected %q", kv)
					}
				}
			}
		})
	}
}

func TestValidEnvName(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		want bool
	}{
		{"PATH", true}, {"_x1", true}, {"a", true}, {"", false}, {"1A", false}, {"A-B", false},
		{"A=B", false}, {"A B", false}, {"Ä", false}, {strings.Repeat("A", 257), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := validEnvName(tt.name); got != tt.want {
				t.Errorf("validEnvName(%q): got %v, want %v", tt.name, got, tt.want)
			}
		})
	}
}
