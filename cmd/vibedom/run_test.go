package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vibedom/vibedom/e2e/clitest"
)

func TestRunBadInput(t *testing.T) {
	t.Parallel()
	c := clitest.New(t)
	dir := t.TempDir()
	file := filepath.Join(dir, "file.txt")
	os.WriteFile(file, []byte("x"), 0o644)
	empty := t.TempDir()
	oldMitm := t.TempDir()
	os.WriteFile(filepath.Join(oldMitm, "mitmdump"), []byte("#!/bin/sh\necho 'Mitmproxy: 7.0.4'\n"), 0o755)
	tests := []struct {
		name string
		env  []string
		args []string
		want string
	}{
		{"no path", nil, []string{"run"}, "no project given"},
		{"missing path", nil, []string{"run", filepath.Join(dir, "nope"), "--", "true"}, "does not exist"},
		{"a file", nil, []string{"run", file, "--", "true"}, "is a file, not a directory"},
		{"bad memory", nil, []string{"run", dir, "--memory", "lots", "--", "true"}, "is not a size"},
		{"tiny memory", nil, []string{"run", dir, "--memory", "64M", "--", "true"}, "at least 128M"},
		{"not enough memory", nil, []string{"run", dir, "--memory", "100000G", "--", "true"}, "not enough memory"},
		{"bad cpus", nil, []string{"run", dir, "--cpus", "0", "--", "true"}, "--cpus must be"},
		{"bad arch", nil, []string{"run", dir, "--arch", "riscv", "--", "true"}, "--arch must be"},
		{"no qemu", []string{"VIBEDOM_QEMU_X86_64=/nonexistent/qemu", "VIBEDOM_QEMU_AARCH64=/nonexistent/qemu"}, []string{"run", dir, "--", "true"}, "nonexistent"},
		{"no kernel", []string{"VIBEDOM_ASSETS=" + empty}, []string{"run", dir, "--", "true"}, "fetch-assets.sh"},
		{"no command without a terminal", nil, []string{"run", dir, "--no-network"}, "not a terminal"},
		{"bad resolve", nil, []string{"run", dir, "--resolve", "example.com:443", "--", "true"}, "NAME:PORT:ADDRESS"},
		{"bad resolve address", nil, []string{"run", dir, "--resolve", "example.com:443:nowhere", "--", "true"}, "bad address"},
		{"missing ca file", nil, []string{"run", dir, "--ca-file", filepath.Join(dir, "nope.pem"), "--", "true"}, "--ca-file"},
		{"bad preflight", nil, []string{"run", dir, "--preflight", "sometimes", "--", "true"}, "--preflight"},
		{"bad proxy engine", nil, []string{"run", dir, "--proxy-engine", "squid", "--", "true"}, "--proxy-engine must be go or mitmproxy"},
		{"no mitmdump", []string{"PATH=" + empty}, []string{"run", dir, "--proxy-engine", "mitmproxy", "--", "true"}, "mitmdump not found"},
		{"old mitmdump", []string{"PATH=" + oldMitm}, []string{"run", dir, "--proxy-engine", "mitmproxy", "--", "true"}, "is version 7.0.4; vibedom needs 8.1 or later"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.name == "no qemu" || tt.name == "no kernel" || tt.name == "no command without a terminal" {
				if _, err := exec.LookPath("qemu-system-x86_64"); err != nil && tt.name != "no qemu" {
					t.Skip("needs QEMU to get that far")
				}
			}
			cc := *c
			cc.Env = append(append([]string{}, c.Env...), tt.env...)
			_, stderr, code := cc.Run(t, "", tt.args...)
			if code == 0 {
				t.Fatalf("exit 0, want an error")
			}
			if !strings.Contains(stderr, tt.want) {
				t.Errorf("stderr %q does not say %q", stderr, tt.want)
			}
			if strings.Contains(stderr, "logs are in") {
				t.Errorf("a refused start made a session:\n%s", stderr)
			}
			if lines := strings.Count(strings.TrimSpace(stderr), "\n"); lines > 1 {
				t.Errorf("error is %d lines, want a short one:\n%s", lines+1, stderr)
			}
		})
	}
	c.AssertNothingLeft(t)
}
