//go:build unix

package mitmproxy

import (
	"os/exec"
	"syscall"
)

// setMitmProcAttr puts mitmdump in its own process group: a Ctrl-C on the
// terminal reaches vibedom, which stops mitmdump in its own order (Close).
// (No Pdeathsig: Linux sends it when the forking thread exits, which a Go
// program does not control.)
func setMitmProcAttr(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
}
