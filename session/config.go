package session

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"github.com/vibedom/vibedom/atomicfile"
	"github.com/vibedom/vibedom/home"
	"io/fs"
	"strings"
	"time"
)

// Config is the user's defaults.
type Config struct {
	// Agent is the agent `vibedom run` starts when neither --agent nor a
	// command is given.
	Agent string
	// ProxyEngine is the default of `vibedom run --proxy-engine`.
	ProxyEngine string
	// Egress and AskTimeout are the defaults of `vibedom run --egress`
	// and --ask-timeout ("egress = ask", "ask-timeout = 90s").
	Egress     string
	AskTimeout time.Duration
	// NoNotify: no desktop notification for ask mode's questions
	// ("notify = off").
	NoNotify bool
}

// ReadConfig reads ~/.vibedom/config (h.Config(): "key = value" lines,
// '#' comments); a missing file is the zero Config.
// Unknown keys and malformed lines are errors naming the line.
func ReadConfig(h home.Home) (*Config, error) {
	b, err := atomicfile.ReadLimited(h.Config(), 64<<10)
	if errors.Is(err, fs.ErrNotExist) {
		return &Config{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", h.Config(), err)
	}
	c := &Config{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		k, v = strings.TrimSpace(k), strings.Trim(strings.TrimSpace(v), `"`)
		if !ok {
			return nil, fmt.Errorf("%s:%d: want key = value", h.Config(), n)
		}
		switch k {
		case "agent":
			c.Agent = v
		case "proxy-engine":
			c.ProxyEngine = v
		case "egress":
			if v != EgressModeAsk && v != EgressModeDeny {
				return nil, fmt.Errorf("%s:%d: egress must be ask or deny, got %q", h.Config(), n, v)
			}
			c.Egress = v
		case "ask-timeout":
			d, err := time.ParseDuration(v)
			if err != nil || d < time.Second || d > time.Hour {
				return nil, fmt.Errorf("%s:%d: ask-timeout must be a duration from 1s to 1h (e.g. 90s), got %q", h.Config(), n, v)
			}
			c.AskTimeout = d
		case "notify":
			if v != "on" && v != "off" {
				return nil, fmt.Errorf("%s:%d: notify must be on or off, got %q", h.Config(), n, v)
			}
			c.NoNotify = v == "off"
		default:
			return nil, fmt.Errorf("%s:%d: unknown setting %q (known: agent, proxy-engine, egress, ask-timeout, notify)", h.Config(), n, k)
		}
	}
	return c, nil
}
