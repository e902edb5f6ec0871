package progress

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

func TestProgressRender(t *testing.T) {
	now := time.Unix(1000, 0)
	var tty bytes.Buffer
	p := &textProgress{w: &tty, tty: true, now: func() time.Time { return now }}
	p.Begin(2, 2<<20)
	now = now.Add(time.Second)
	p.Advance("a", 1<<20)
	p.End("a", nil)
	p.Close()
	if s := tty.String(); !strings.Contains(s, "\r[===============               ] 1/2  1.0 MiB/2.0 MiB  1.0 MiB/s  ETA 0:01") {
		t.Errorf("tty output %q", s)
	}
	var plain bytes.Buffer
	q := NewText(&plain, false)
	q.Begin(1, 10)
	q.Advance("a", 10)
	q.End("a-1-r0", nil)
	q.Close()
	if s := plain.String(); !strings.HasPrefix(s, "[1/1] a-1-r0\n1 packages, 10 B in ") || strings.Contains(s, "\r") {
		t.Errorf("plain output %q", s)
	}
}
