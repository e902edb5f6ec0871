//go:build !darwin

package session

// deskPlatform: no desktop notifications outside macOS.
var deskPlatform deskPost
