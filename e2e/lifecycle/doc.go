// Package lifecycle holds the end-to-end tests of a session's life through
// the vibedom command: run and exit codes, the interactive shell, the change
// set and --apply, concurrent edits, detach/attach/pause/resume/stop,
// recover after a crash, and the collection of changes (large files, busy
// writers, stalls, interrupts). It has no code but its tests and does not
// test the session package's internals.
package lifecycle
