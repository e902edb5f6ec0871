//go:build !linux

package guest

import "syscall"

// agentCaps: only Linux guests run commands as the agent user.
func agentCaps(*syscall.SysProcAttr) {}
