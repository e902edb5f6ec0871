// Package agents holds the end-to-end tests of the guest image and the real
// agent CLIs: `vibedom init` builds the root image from the test mirror and
// boots it (amd64, and arm64 under emulation), and codex and Claude Code run
// in it against fake model APIs (their subscription logins and Gemini are in
// e2e/subscriptions). It has no code but its tests and does not
// test the agents package's internals.
package agents
