// Package image builds, caches and verifies the boot images vibedom's VMs
// start from, and the small per-session archive appended to them.
//
// What it does:
//   - writes (and, for tests and tools, reads) cpio "newc" archives, the
//     format of a Linux initramfs, deterministically, so the same inputs
//     give byte-identical archives and stable digests;
//   - resolves the kernel modules the guest needs, with their dependencies,
//     from the modules' own .modinfo metadata in a Debian kernel package;
//   - assembles the test image (recipe DebianTest): a kernel and an
//     initramfs holding vibedom-guest as /init, a static busybox and the
//     modules with their load order;
//   - caches built images under <cacheRoot>/<name>-<digest>/ with a
//     manifest of checksums, and verifies a cached image before handing it
//     out (see Ensure for how much verification the warm path does);
//   - writes a session's initrd: the cached base initramfs followed by a
//     small cpio holding the session's boot data and guest host key;
//   - finds the downloaded assets (LocateAssets).
//
// What it does not do: it downloads nothing (scripts/fetch-assets.sh does),
// boots nothing (package vm does), and makes no keys (package keys does). It
// logs nothing.
package image
