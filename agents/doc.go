// Package agents fetches the coding agents' command-line programs (Claude
// Code, Codex, OpenCode) on the host, verifies them and unpacks each into a
// directory of its own under ~/.vibedom/agents, ready to be shared
// read-only into the guest as a layer apart from the base image.
//
// Every agent ships a native per-platform binary as an npm package that
// needs no node at run time. The packages, their exact versions and their
// tarballs' SHA-512 integrities are pinned in this package's source (Pins);
// they move only with a vibedom release. Fetch talks to an npm registry's
// HTTP API with net/http: the packument gives the tarball's address and
// integrity, which must equal the pin; the tarball is downloaded into a
// cache while its SHA-512 is computed and is used only once it matches.
//
// The package does not run anything it fetches, does not install node or
// the agents' JavaScript wrappers, does not resolve "latest" or any other
// tag, and never trusts a version or integrity that is not compiled in.
// It does not decide how the guest mounts the directory or launches the
// agent; Find tells a caller where an installed agent's binary is.
package agents
