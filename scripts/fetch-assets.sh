#!/usr/bin/env bash
# fetch-assets.sh [DEST] — fetches what the image package builds the Linux
# (QEMU) test image from, for amd64 and arm64:
#
#   DEST/<arch>/kernel/   a Debian kernel package unpacked with dpkg-deb -x
#                         (boot/vmlinuz-<rel>, lib/modules/<rel>/…)
#   DEST/<arch>/busybox   the static busybox of Debian's busybox-static
#   DEST/<arch>/.complete stamp: the package versions that were unpacked
#   DEST/<arch>/debs/     the Debian packages of scripts/test-userland.txt
#                         (bash, git and the libraries they need,
#                         ca-certificates), as .deb files, and
#                         test-userland.txt (the list, which names the
#                         package each becomes), and
#                         busybox.paths: `busybox --list-full` of the
#                         busybox above (the test mirror builds Alpine-shaped
#                         packages from these; see docs/image.md)
#   DEST/<arch>/debs/.complete stamp: the list's checksum and the files
#
# DEST defaults to .cache/assets in the repository root (ignored by git).
# Idempotent: an arch whose stamp and files are present is skipped. Quiet
# unless something fails. Runs as root without a TTY (CI) and uses sudo only
# for the apt steps that need root when not run as root.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
dest=${1:-$root/.cache/assets}
archs=(amd64 arm64)

die() {
	echo "fetch-assets: $*" >&2
	exit 1
}

complete() {
	local d=$1/$2
	[ -f "$d/.complete" ] && [ -x "$d/busybox" ] && [ -d "$d/kernel/lib/modules" ] &&
		compgen -G "$d/kernel/boot/vmlinuz-*" >/dev/null
}

userland=$root/scripts/test-userland.txt
[ -f "$userland" ] || die "$userland is missing"
userland_sum=$(sha256sum "$userland" | cut -d' ' -f1)

debs_complete() {
	local f=$1/$2/debs/.complete
	[ -f "$f" ] && [ "$(head -n 1 "$f")" = "list $userland_sum" ] && [ -s "$1/$2/debs/busybox.paths" ] &&
		cmp -s "$userland" "$1/$2/debs/test-userland.txt"
}

todo=()
debs_todo=()
for arch in "${archs[@]}"; do
	complete "$dest" "$arch" || todo+=("$arch")
	debs_complete "$dest" "$arch" || debs_todo+=("$arch")
done
((${#todo[@]} + ${#debs_todo[@]})) || exit 0

if ! command -v apt-get >/dev/null || ! command -v dpkg-deb >/dev/null; then
	die "apt-get and dpkg-deb not found: the test kernels come from Debian packages, so run this on a Debian or Ubuntu host (CI, a Linux box, or a Linux VM). On a Mac vibedom boots a different (Alpine) image and does not need these assets."
fi

sudo=()
if [ "$(id -u)" != 0 ]; then
	command -v sudo >/dev/null || die "not root and sudo not found: run as root, or install sudo"
	sudo=(sudo)
fi

log=$(mktemp "${TMPDIR:-/tmp}/fetch-assets.XXXXXX.log")
work=
cleanup() {
	rm -f "$log"
	if [ -n "$work" ]; then rm -rf "$work"; fi
}
trap cleanup EXIT

# run CMD… quietly; on failure print what it said and stop.
run() {
	if ! "$@" >>"$log" 2>&1; then
		echo "fetch-assets: failed: $*" >&2
		tail -n 40 "$log" >&2
		exit 1
	fi
}

native=$(dpkg --print-architecture)
updated=
apt_update() {
	if [ -z "$updated" ]; then
		run "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q
		updated=1
	fi
}

mkdir -p "$dest"
dest=$(cd "$dest" && pwd)

for arch in "${todo[@]}"; do
	if [ "$arch" != "$native" ] && ! dpkg --print-foreign-architectures | grep -qx "$arch"; then
		run "${sudo[@]}" dpkg --add-architecture "$arch"
		updated=
		apt_update
	fi
	meta=linux-image-$arch:$arch
	if ! apt-cache show "$meta" >/dev/null 2>&1 || ! apt-cache show "busybox-static:$arch" >/dev/null 2>&1; then
		apt_update
	fi
	# The meta package only depends on the real, versioned kernel package.
	real=$(apt-cache depends "$meta" 2>>"$log" | awk '$1 == "Depends:" && $2 ~ /^linux-image-[0-9]/ { print $2; exit }')
	[ -n "$real" ] || die "cannot tell which kernel package $meta depends on (apt-cache depends $meta)"
	real=${real%%:*}

	work=$(mktemp -d "$dest/.tmp-$arch.XXXXXX")
	# apt-get download writes into the current directory; as root it warns that
	# the _apt user cannot write there, which is harmless.
	chmod 0755 "$work"
	cd "$work"
	run apt-get download -q "$real:$arch" "busybox-static:$arch"
	cd "$root"
	kdeb=$(compgen -G "$work/${real}_*.deb" | head -n 1) || true
	bdeb=$(compgen -G "$work/busybox-static_*.deb" | head -n 1) || true
	[ -n "$kdeb" ] && [ -n "$bdeb" ] || die "apt-get download did not produce $real and busybox-static for $arch"

	mkdir -p "$work/out/kernel" "$work/bb"
	run dpkg-deb -x "$kdeb" "$work/out/kernel"
	run dpkg-deb -x "$bdeb" "$work/bb"
	install -m 0755 "$work/bb/bin/busybox" "$work/out/busybox"
	compgen -G "$work/out/kernel/boot/vmlinuz-*" >/dev/null || die "$kdeb has no boot/vmlinuz-*"
	[ -d "$work/out/kernel/lib/modules" ] || die "$kdeb has no lib/modules"

	{
		echo "kernel $(dpkg-deb -f "$kdeb" Package) $(dpkg-deb -f "$kdeb" Version)"
		echo "busybox $(dpkg-deb -f "$bdeb" Package) $(dpkg-deb -f "$bdeb" Version)"
	} >"$work/out/.complete.tmp"

	if [ -d "$dest/$arch/debs" ]; then mv "$dest/$arch/debs" "$work/out/debs"; fi
	rm -rf "$dest/$arch"
	mv "$work/out" "$dest/$arch"
	mv "$dest/$arch/.complete.tmp" "$dest/$arch/.complete"
	rm -rf "$work"
	work=
done

# The userland packages, downloaded as .deb files (not unpacked: the test
# mirror reads them in Go).
mapfile -t userland_debs < <(awk '!/^#/ && NF { print $1 }' "$userland")
((${#userland_debs[@]})) || die "$userland lists no packages"
for arch in "${debs_todo[@]}"; do
	if [ "$arch" != "$native" ] && ! dpkg --print-foreign-architectures | grep -qx "$arch"; then
		run "${sudo[@]}" dpkg --add-architecture "$arch"
		updated=
	fi
	wanted=()
	for p in "${userland_debs[@]}"; do
		apt-cache show "$p" >/dev/null 2>&1 || apt_update
		# Architecture: all packages (ca-certificates) have no :<arch> name.
		if apt-cache show --no-all-versions "$p" 2>>"$log" | grep -x 'Architecture: all' >/dev/null; then
			wanted+=("$p")
		else
			wanted+=("$p:$arch")
		fi
	done
	work=$(mktemp -d "$dest/.tmp-debs-$arch.XXXXXX")
	chmod 0755 "$work"
	mkdir "$work/debs"
	cd "$work/debs"
	run apt-get download -q "${wanted[@]}"
	cd "$root"
	for p in "${userland_debs[@]}"; do
		compgen -G "$work/debs/${p}_*_*.deb" >/dev/null || die "apt-get download did not produce $p for $arch"
	done

	# Busybox's applets and where they go, as Alpine's busybox package
	# lists them in etc/busybox-paths.d/busybox. Asked of the busybox
	# this host runs: the same Debian build for every arch has the same
	# applets, which the stamps' versions confirm.
	bbver() { sed -n 's/^busybox //p' "$dest/$1/.complete"; }
	runnable=$native
	[ -x "$dest/$runnable/busybox" ] || die "no busybox for this host's arch ($native) in $dest: cannot list the applets"
	[ "$(bbver "$arch")" = "$(bbver "$runnable")" ] ||
		die "busybox for $arch ($(bbver "$arch")) is not the version of $runnable's ($(bbver "$runnable")): rm -rf $dest and run again"
	"$dest/$runnable/busybox" --list-full | sed 's:^:/:' | sort >"$work/debs/busybox.paths"
	[ -s "$work/debs/busybox.paths" ] || die "busybox --list-full printed nothing"

	cp "$userland" "$work/debs/test-userland.txt"
	{
		echo "list $userland_sum"
		(cd "$work/debs" && ls -- *.deb)
	} >"$work/debs/.complete.tmp"
	rm -rf "$dest/$arch/debs"
	mkdir -p "$dest/$arch"
	mv "$work/debs" "$dest/$arch/debs"
	mv "$dest/$arch/debs/.complete.tmp" "$dest/$arch/debs/.complete"
	rm -rf "$work"
	work=
done
