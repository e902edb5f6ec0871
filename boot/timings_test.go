package boot

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestGuestTimings(t *testing.T) {
	tests := []struct {
		name    string
		console string
		want    string
	}{
		{"none", "[    0.1] Linux version\nlevel=INFO msg=\"guest set up\" src=vibedom-guest took=1s\n", ""},
		{"steps and agent", "[    4.0] Run /init as init process\n" +
			"level=INFO msg=\"boot timings\" src=vibedom-guest kernel=3.9s modules=637ms workspace=10ms setup=911ms\n" +
			"level=INFO msg=\"serving the control channel\" src=vibedom-guest port=/dev/vport0p1 uptime=5.005s\n",
			"kernel 3.9s, modules 637ms, workspace 10ms, setup 911ms, agent 5.005s"},
		{"bad values dropped", "level=INFO msg=\"boot timings\" src=vibedom-guest kernel=1x modules=fast setup=2s\n",
			"setup 2s"},
		{"negative: not the line", "level=INFO msg=\"boot timings\" src=vibedom-guest kernel=-1s\n", ""},
		// Escapes, another source or trailing text: not the line.
		{"forged", "level=INFO msg=\"boot timings\" src=vibedom-guest kernel=1s \x1b[2J\n" +
			"xlevel=INFO msg=\"boot timings\" src=vibedom-guest kernel=1s\n" +
			"level=INFO msg=\"boot timings\" src=other kernel=1s\n", ""},
		{"the last line counts", "level=INFO msg=\"boot timings\" src=vibedom-guest kernel=1s\n" +
			"level=INFO msg=\"boot timings\" src=vibedom-guest kernel=2s\n", "kernel 2s"},
		{"at most 16 steps", "level=INFO msg=\"boot timings\" src=vibedom-guest" + strings.Repeat(" a=1ms", 40) + "\n",
			strings.TrimSuffix(strings.Repeat("a 1ms, ", 16), ", ")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "console.log")
			if err := os.WriteFile(p, []byte(tt.console), 0o600); err != nil {
				t.Fatal(err)
			}
			if got := FormatSteps(GuestTimings(p)); got != tt.want {
				t.Errorf("got %q, want %q", got, tt.want)
			}
		})
	}
	if GuestTimings(filepath.Join(t.TempDir(), "absent")) != nil {
		t.Error("timings from a missing console log")
	}
}
