package guest

import (
	"testing"

	"github.com/vibedom/vibedom/guest/proto"
)

func TestParseMemInfo(t *testing.T) {
	const good = "MemTotal:        2009540 kB\nMemFree:         1702412 kB\nMemAvailable:    1781196 kB\nBuffers:            2048 kB\n"
	mi, err := parseMemInfo([]byte(good))
	if err != nil || mi != (proto.MemInfo{Total: 2009540 << 10, Available: 1781196 << 10}) {
		t.Fatalf("parseMemInfo = %+v, %v", mi, err)
	}
	back, err := proto.ParseMemInfo(mi.Marshal())
	if err != nil || back != mi {
		t.Fatalf("round trip = %+v, %v", back, err)
	}
	for name, bad := range map[string]string{
		"no available": "MemTotal: 100 kB\n",
		"no unit":      "MemTotal: 100\nMemAvailable: 50 kB\n",
		"not a number": "MemTotal: 1x0 kB\nMemAvailable: 50 kB\n",
		"huge":         "MemTotal: 99999999999999999999 kB\nMemAvailable: 50 kB\n",
	} {
		if mi, err := parseMemInfo([]byte(bad)); err == nil {
			t.Errorf("%s: parseMemInfo = %+v, want an error", name, mi)
		}
	}
	if _, err := proto.ParseMemInfo(make([]byte, 15)); err == nil {
		t.Error("ParseMemInfo took 15 bytes")
	}
}
