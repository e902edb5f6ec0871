#!/usr/bin/env bash
# build-kernel.sh [ARCH] — builds vibedom's own guest kernel for ARCH (amd64,
# the default) from a pinned Debian kernel source package and the options in
# image/kernel/config/, into
#
#   .cache/assets/<arch>/guest-kernel/   (or $VIBEDOM_ASSETS/<arch>/…)
#     boot/vmlinuz-<release>              the kernel (x86: a bzImage with a
#                                         PVH entry, which vibedom unpacks)
#     boot/config-<release>               its whole configuration
#     lib/modules/<release>/modules.builtin, modules.builtin.modinfo,
#                                         modules.order (empty: every driver
#                                         is built in, nothing is loadable)
#     SOURCE                              what it was built from
#     .complete                           the build key (below)
#
# vibedom boots this kernel instead of the distribution's when it is there
# (image/assets.LocateKernel); VIBEDOM_KERNEL=distro boots the other.
#
# The key is a hash of the source package's checksum, the option files and
# this script: a folder whose .complete holds the current key is kept, so a
# second run builds nothing. The source is unpacked and built under
# .cache/kernel-build/ (about 1.7 GB; kept so a changed option rebuilds only
# what it touches; `rm -rf .cache/kernel-build` frees it).
#
# Needs: apt-get (the source package), gcc, make, flex, bison, bc and
# libelf-dev; setup.sh installs them. Takes 5–10 minutes on two cores.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
arch=${1:-amd64}
dest_root=${VIBEDOM_ASSETS:-$root/.cache/assets}
work=$root/.cache/kernel-build

# The pinned source: Debian bookworm's linux-source-6.1, checked by hash.
src_pkg=linux-source-6.1
src_version=6.1.192-2
src_sha256=ae95fe63d4c553f8d0e6c86cb1ab566f3894a43743eb19ab585cd97d82f26514
src_dir=linux-source-6.1

die() {
	echo "build-kernel: $*" >&2
	exit 1
}

case $arch in
amd64) karch=x86 target=bzImage image=arch/x86/boot/bzImage cross= ;;
*) die "no guest kernel configuration for $arch (only amd64 is built so far; the other arch boots its distribution kernel)" ;;
esac

cfgdir=$root/image/kernel/config
frags=("$cfgdir/common.config" "$cfgdir/$arch.config")
for f in "${frags[@]}"; do
	[ -f "$f" ] || die "$f is missing"
done

key=$(cat "$0" "${frags[@]}" <(echo "$src_pkg $src_version $src_sha256") | sha256sum | cut -d' ' -f1)
dest=$dest_root/$arch/guest-kernel
if [ "$(cat "$dest/.complete" 2>/dev/null)" = "$key" ]; then
	exit 0
fi

for t in gcc make flex bison bc; do
	command -v "$t" >/dev/null || die "$t not found: run scripts/setup.sh (or apt-get install build-essential flex bison bc libelf-dev)"
done
[ -f /usr/include/libelf.h ] || [ -f /usr/include/elfutils/libelf.h ] || die "libelf headers not found: apt-get install libelf-dev"

mkdir -p "$work"
# One build at a time per checkout: the source tree and log are shared.
exec 9>"$work/.lock"
if ! flock -n 9; then
	echo "build-kernel: another build is running; waiting for it" >&2
	flock 9
fi
if [ "$(cat "$dest/.complete" 2>/dev/null)" = "$key" ]; then
	exit 0
fi
deb=$work/${src_pkg}_${src_version}_all.deb
if [ "$(sha256sum "$deb" 2>/dev/null | cut -d' ' -f1)" != "$src_sha256" ]; then
	command -v apt-get >/dev/null || die "apt-get not found: the guest kernel's source is a Debian package ($src_pkg $src_version)"
	echo "build-kernel: downloading $src_pkg $src_version (139 MB)" >&2
	rm -f "$deb"
	(cd "$work" && apt-get download -q "$src_pkg=$src_version" >/dev/null 2>"$work/download.log") ||
		die "apt-get download $src_pkg=$src_version failed: $(tail -n 3 "$work/download.log")"
	got=$(sha256sum "$deb" | cut -d' ' -f1)
	[ "$got" = "$src_sha256" ] || {
		rm -f "$deb"
		die "$src_pkg $src_version has SHA-256 $got, not the pinned $src_sha256"
	}
fi

# The unpacked tree is tied to the package's hash: another source version
# starts from a fresh tree.
tree=$work/$arch-${src_sha256:0:16}/$src_dir
if [ ! -f "$tree/.unpacked" ]; then
	echo "build-kernel: unpacking the source" >&2
	rm -rf "$(dirname "$tree")"
	mkdir -p "$(dirname "$tree")"
	dpkg-deb --fsys-tarfile "$deb" | tar -xO "./usr/src/$src_dir.tar.xz" | tar -xJ -C "$(dirname "$tree")"
	touch "$tree/.unpacked"
fi

log=$work/$arch-build.log
echo "build-kernel: building the guest kernel for $arch from $src_pkg $src_version (5–10 minutes on two cores; once; log: $log)" >&2
# Reproducible: no date, user or host of this machine in the kernel.
export KBUILD_BUILD_TIMESTAMP='2026-01-01 00:00:00 UTC' KBUILD_BUILD_USER=vibedom KBUILD_BUILD_HOST=vibedom KBUILD_BUILD_VERSION=1
mk=(make -C "$tree" ARCH="$karch" ${cross:+CROSS_COMPILE=$cross} LOCALVERSION=-vibedom)
if ! { "${mk[@]}" tinyconfig >"$log" 2>&1 &&
	"$tree/scripts/kconfig/merge_config.sh" -m -O "$tree" "$tree/.config" "${frags[@]}" >>"$log" 2>&1 &&
	"${mk[@]}" olddefconfig >>"$log" 2>&1; }; then
	die "configuring failed: $(tail -n 5 "$log")"
fi

# Every option asked for must hold, on or off: a dependency that is not
# met drops an option silently, and the guest would boot without it.
missing=()
for f in "${frags[@]}"; do
	while IFS= read -r line || [ -n "$line" ]; do
		case $line in
		'# CONFIG_'*' is not set') name=${line#\# } name=${name%% *} ;;
		'' | '#'*) continue ;;
		*) name=${line%%=*} ;;
		esac
		grep -qxF "$line" "$tree/.config" && continue
		got=$(grep -E "^(# )?$name[= ]" "$tree/.config" || true)
		# An option whose dependencies are off is absent: off too.
		[[ -z $got && $line == '# '* ]] && continue
		missing+=("$line (got: ${got:-absent})")
	done <"$f"
done
((${#missing[@]} == 0)) || die "options that did not hold: ${missing[*]}"

"${mk[@]}" -j"$(nproc)" "$target" >>"$log" 2>&1 || die "the build failed: $(tail -n 15 "$log")"
release=$("${mk[@]}" -s kernelrelease)

mkdir -p "$dest_root/$arch"
tmp=$(mktemp -d "$dest_root/$arch/.guest-kernel.XXXXXX")
mkdir -p "$tmp/boot" "$tmp/lib/modules/$release"
cp "$tree/$image" "$tmp/boot/vmlinuz-$release"
cp "$tree/.config" "$tmp/boot/config-$release"
cp "$tree/modules.builtin" "$tree/modules.builtin.modinfo" "$tmp/lib/modules/$release/"
: >"$tmp/lib/modules/$release/modules.order"
printf '%s %s sha256:%s\noptions: image/kernel/config/{common,%s}.config\nrelease: %s\n' \
	"$src_pkg" "$src_version" "$src_sha256" "$arch" "$release" >"$tmp/SOURCE"
echo "$key" >"$tmp/.complete"
chmod 755 "$tmp"
# The old folder is moved aside whole before the new one takes its name, so
# a reader never finds a .complete beside half a kernel.
old=
if [ -e "$dest" ]; then
	old=$dest_root/$arch/.guest-kernel.old.$$
	mv "$dest" "$old"
fi
mv "$tmp" "$dest"
[ -z "$old" ] || rm -rf "$old"
echo "build-kernel: $dest/boot/vmlinuz-$release" >&2
