// Package mitmproxy is what vibedom knows of mitmproxy itself: the oldest
// mitmdump it supports and the check of a given one's version
// (MitmdumpVersion, MitmwebVersion), the standalone release it pins
// (Release, with a SHA-256 per platform), and the installer that fetches
// that release from a mirror, checks it and unpacks it under
// ~/.vibedom/mitmproxy (Install, Lookup, PreferredMitmdump).
//
// It does not run the mitmproxy engine (netfilter.MitmproxyEngine starts
// mitmdump with the addon and answers its questions).
package mitmproxy

// The oldest mitmdump the engine supports (its addon hooks and options).
const (
	MinMitmdumpMajor = 8
	MinMitmdumpMinor = 1
)
