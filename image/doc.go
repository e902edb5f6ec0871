// Package image assembles, caches and verifies the boot images vibedom's
// VMs start from. It is the assembly of the image rooms below it:
//
//	image/alpine     verified Alpine packages: index, resolve, lock, fetch
//	image/ext4       a deterministic ext4 image from a file tree
//	image/rootfs     the guest's read-only root image from locked packages
//	image/kernel     a bootable kernel from a kernel package; module resolution
//	image/initramfs  cpio archives; the per-session boot data archive
//	image/assets     where the Linux test assets and vibedom-guest are
//
// Those rooms never import image; image imports them.
//
// What it does:
//   - builds this home's guest image (BuildGuest): the package lock, the
//     verified packages, the root image (named by its sha256 under
//     images/root, shared by sessions: InstallRootImage, VerifyRootImage)
//     and the boot files; records it in a manifest (ReadGuestManifest) and
//     hands it to a session (LoadGuest; Choose and Choice.Prepare decide
//     between it and the Debian test image);
//   - assembles boot files by recipe: AlpineBoot (linux-virt unwrapped to
//     a raw kernel, and an initramfs of vibedom-guest as /init, busybox and
//     the guest's modules) and DebianTest (the same from the Linux test
//     assets);
//   - caches built images under <cacheRoot>/<name>-<digest>/ with a
//     manifest of checksums, and verifies a cached image before handing it
//     out (see Ensure for how much verification the warm path does);
//   - writes a session's initrd (SessionFiles, WriteSessionInitrd): the
//     cached base initramfs followed by the session's archive of boot data
//     and guest host key.
//
// What it does not do: it boots nothing (package vm does), makes no keys
// (package keys does) and decides nothing about sessions (package session
// asks it for an image). It downloads only what BuildGuest's lock names,
// through image/alpine; the Linux test assets come from
// scripts/fetch-assets.sh. It logs nothing.
package image
