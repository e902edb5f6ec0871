// Package mitmproxy is the mitmproxy engine (Engine), the second engine of
// vibedom's egress proxy, and what vibedom knows of mitmproxy itself.
//
// The engine starts and owns a mitmdump (mitmweb for the live view)
// running vibedom's addon (addon.py), hands it every admitted connection,
// and answers the addon's questions about each TLS handshake, request,
// response and WebSocket message over a private control socket, with the
// same checks and the same request filters as the Go engine. It is built
// on the Go engine's front end (netfilter/mitm): the explicit proxy, the
// dial guard every upstream connection goes through, the memory budget.
//
// What it knows of mitmproxy: the oldest mitmdump it supports and the
// check of a given one's version (MitmdumpVersion, MitmwebVersion), the
// standalone release it pins (Release, with a SHA-256 per platform), and
// the installer that fetches that release from a mirror, checks it and
// unpacks it under ~/.vibedom/mitmproxy (Install, Lookup,
// PreferredMitmdump).
//
// It does not decide the policy (netfilter/egress), scan for secrets or
// swap credentials (the filters are built in netfilter), or write the logs.
package mitmproxy

// The oldest mitmdump the engine supports (its addon hooks and options).
const (
	MinMitmdumpMajor = 8
	MinMitmdumpMinor = 1
)
