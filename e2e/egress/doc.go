// Package egress holds the end-to-end tests of a session's only way out, on
// both proxy engines: the egress policy and the dial guard seen from a guest,
// DLP scrubbing of what the guest sends, the --inspect live view, and git
// push through the forwarded SSH agent. It has no code but its tests and
// does not test netfilter's or dlp's internals.
package egress
