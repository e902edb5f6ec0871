// Package kernel turns a Linux kernel package into what vibedom's
// hypervisors boot, and finds the kernel modules a guest needs.
//
// What it does:
//   - finds boot/vmlinuz-<release> and its lib/modules/<release> in an
//     unpacked Debian kernel package (Find);
//   - writes a kernel in the form the hypervisors boot (Write): an x86
//     bzImage as is, or its uncompressed vmlinux when it has a PVH entry
//     (QEMU then skips the real-mode boot and the self-decompression); an
//     arm64 kernel as an uncompressed Image (gunzipped, or taken out of an
//     EFI zboot wrapper), checking the boot header either way;
//   - checks that a program is an ELF executable for a guest architecture
//     (CheckELF, Machine);
//   - resolves the modules the guest needs (GuestModules), with their
//     dependencies and a load order, from the modules' own .modinfo
//     metadata, in a folder or an fs.FS (ResolveModules*), and reads a
//     module, unpacking a .ko.gz (ReadModule*; .ko.xz and .ko.zst are
//     refused with ErrCompressedModule);
//   - takes out of a module what the guest kernel would check on every
//     load and never use: its appended signature (StripSignature) and its
//     BPF type information (HideBTF renames the .BTF section).
//
// What it does not do: it packs nothing into an initramfs (package
// image/initramfs writes archives; package image assembles them), caches
// nothing on disk (it memoizes .ko.gz metadata in memory, keyed by the
// SHA-256 of the compressed bytes), downloads nothing and logs nothing.
// It imports vm (for vm.Arch) and no other package of this project.
package kernel
