// Package initramfs writes and reads cpio "newc" archives, the format of a
// Linux initramfs, and builds the small per-session archive appended to a
// guest's base initramfs.
//
// What it does:
//   - writes archives deterministically (Archive: members in a fixed
//     order, times fixed), so the same inputs give
//     byte-identical archives and stable digests; streams one (Writer);
//   - reads archives, concatenated ones included, for tests and tools
//     (ReadArchive), refusing malformed ones (ErrBadArchive);
//   - checks member names (CleanName): clean, relative, no "..";
//   - builds a session's archive from its boot data files (File,
//     SessionArchive): only /vibedom/<name> or a top-level name, plain
//     files, so an appended archive cannot reset a base directory's owner
//     or mode. File never shows its content (the guest's host key) in a
//     log line, %v, %#v or JSON.
//
// What it does not do: it chooses no files (package image decides what an
// image holds and writes the session's initrd), resolves no kernel modules
// (package image/kernel does) and logs nothing. It imports no package of
// this project.
package initramfs
