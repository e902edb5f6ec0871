// Package subscriptions holds the end-to-end tests of the agents' subscription
// logins (Claude's and codex's imported OAuth tokens, swapped and refreshed on
// the host) and of the Gemini CLI, against fake APIs. It was split from
// e2e/agents so that `go test ./...` runs the two beside each other, each well
// under the per-package timeout. It has no code but its tests.
package subscriptions
