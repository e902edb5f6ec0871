// Package ports holds the end-to-end test of published ports through the
// vibedom command: run -p, vibedom port add|rm|list, status, and a second
// session refused the same host port. It has no code but its tests.
package ports
