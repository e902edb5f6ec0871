#!/usr/bin/env bash
# Installs what vibedom's Linux (QEMU) mode and its test suite need on a
# Debian/Ubuntu host, fetches the test kernels and busybox, and builds
# vibedom's guest kernel for this host's arch (scripts/build-kernel.sh:
# a few minutes, once). Idempotent: a second run installs, downloads and
# builds nothing.
set -euo pipefail
cd "$(dirname "$0")/.."

pkgs=(qemu-system-x86 qemu-system-arm busybox-static cpio git patch make mitmproxy chromium
	gcc libc6-dev flex bison bc libelf-dev xz-utils)
missing=()
for p in "${pkgs[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
	if ! command -v apt-get >/dev/null; then
		echo "setup: apt-get not found; install by hand: ${missing[*]}" >&2
		exit 1
	fi
	sudo=()
	if [ "$(id -u)" != 0 ]; then sudo=(sudo); fi
	echo "setup: installing ${missing[*]}" >&2
	"${sudo[@]}" apt-get update -qq >/dev/null
	DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
scripts/fetch-assets.sh
case $(dpkg --print-architecture 2>/dev/null || uname -m) in
amd64 | x86_64)
	# Without it sessions boot the distribution's kernel, only slower; CI
	# must build it, so there a failure stops the run.
	if ! scripts/build-kernel.sh amd64; then
		[ -z "${CI:-}" ] || exit 1
		echo "setup: the guest kernel was not built (above); sessions boot Debian's kernel until \`make kernel\` succeeds" >&2
	fi
	;;
*) echo "setup: no guest kernel configuration for this arch yet; the guest boots the distribution's kernel" >&2 ;;
esac
