//go:build !linux && !darwin

package session

// procStart is not known on this system: liveness rests on the PID alone.
func procStart(int) string { return "" }

func procZombie(int) bool { return false }
