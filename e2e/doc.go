// Package e2e is the home of vibedom's end-to-end tests: each package below
// it builds ./cmd/vibedom and drives the binary the way a user does, against
// real QEMU VMs. They are split into packages so that `go test ./...` runs
// them beside each other and beside the unit packages.
//
//   - e2e/clitest: the shared driver of the built command (no tests);
//   - e2e/agents: the guest image built from the test mirror, and the real
//     agent CLIs (codex, Claude Code) in it;
//   - e2e/egress: the network way out: egress policy, DLP, the live view,
//     git over the forwarded SSH agent;
//   - e2e/lifecycle: run, shell, apply, detach/attach/pause/stop, recover and
//     the collection of changes.
//
// Every VM test's name contains VM (or Arm64 for the arm64 guest) and skips
// with a reason when QEMU or the test assets are missing. Nothing here tests
// a package's internals: those tests live beside their package.
package e2e
