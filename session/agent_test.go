package session

import (
	"strings"
	"testing"

	"github.com/vibedom/vibedom/home"
)

func TestReadConfig(t *testing.T) {
	h := home.Home(t.TempDir())
	c, err := ReadConfig(h)
	if err != nil || c.Agent != "" {
		t.Fatalf("missing config: %+v %v", c, err)
	}
	writeFileAtomic(h.Config(), []byte("# defaults\nagent = \"claude\"\n"), 0o600)
	if c, err := ReadConfig(h); err != nil || c.Agent != "claude" {
		t.Errorf("agent: %+v %v", c, err)
	}
	writeFileAtomic(h.Config(), []byte("colour = blue\n"), 0o600)
	if _, err := ReadConfig(h); err == nil || !strings.Contains(err.Error(), "config:1") {
		t.Errorf("unknown key: %v", err)
	}
}
