// Package branch holds the end-to-end test of a session's work as a git
// branch through the vibedom command (run, then apply --branch). It has no
// code but its tests.
package branch
