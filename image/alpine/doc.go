// Package alpine fetches, verifies and resolves Alpine Linux packages in
// pure Go on the host, for building vibedom's guest root image.
//
// What it does:
//   - pins one Alpine release (Branch), its main and community
//     repositories and the aarch64 and x86_64 architectures; a mirror can
//     be chosen (Options.Mirror, VIBEDOM_ALPINE_MIRROR via MirrorFromEnv);
//   - fetches each APKINDEX.tar.gz and verifies its RSA signature against
//     Alpine's release keys embedded in vibedom (ReleaseKeys), each key
//     bound to the architecture it signs; tests inject their own Keyring;
//   - parses the index and resolves a package list with its dependencies
//     (Resolve), deterministically, into a Lock that a later build
//     reproduces exactly or reports what changed (Lock.Diff, ErrLockDrift);
//   - downloads the locked packages (Fetch): resumable, a bounded number
//     in parallel, into a download cache, each verified against the
//     index's size and checksum, the package signature and the .PKGINFO
//     datahash before it is kept;
//   - walks a verified package's data (Extract) and hands each entry, with
//     a clean relative path, to an EntryWriter.
//
// What it does not do: it runs no install scripts, writes nothing from a
// package onto the host's file system (Extract only hands entries to a
// writer), builds no image (package image does) and logs nothing; progress
// goes to an optional Progress.
package alpine
