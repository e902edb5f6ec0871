//go:build !unix

package mitmproxy

import "os/exec"

// setMitmProcAttr: without Pdeathsig, Close (and the session's cleanup)
// stops mitmdump.
func setMitmProcAttr(*exec.Cmd) {}
