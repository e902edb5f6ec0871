#!/usr/bin/env bash
# Acceptance test of a release build (`make release-check` runs `make
# release` first): dist/ verifies against its SHA256SUMS, and the Linux
# archive for this machine, extracted alone into an empty folder and run with
# a temporary HOME and a PATH without the repository or Go, carries its guest
# agent: `vibedom init` and a session that ends in the review work.
#
# Offline, as the other tests: the Alpine mirror is a closed loopback port,
# so `init` falls back to the Debian test image built from the repository's
# test kernels ($VIBEDOM_ASSETS, default .cache/assets, `make assets`); the
# guest agent can come only from the binary. It boots one QEMU VM.
#
#   scripts/release-check.sh [DIST]     (default dist/)
#   KEEP=1 scripts/release-check.sh     keep the temporary folder
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
dist="$(cd "${1:-$repo/dist}" && pwd)"
say() { echo "release-check: $*"; }
fail() {
	echo "release-check: FAILED: $*" >&2
	exit 1
}

case "$(uname -m)" in
x86_64 | amd64) arch=amd64 qemu=qemu-system-x86_64 machine=x86_64 ;;
aarch64 | arm64) arch=arm64 qemu=qemu-system-aarch64 machine=aarch64 ;;
*) fail "no Linux release archive for $(uname -m)" ;;
esac
[ "$(uname -s)" = Linux ] || fail "run it on Linux (the darwin archive is checked by .github/workflows/release.yml)"

# 1. The release verifies against its SHA256SUMS, and a changed byte is caught.
[ -s "$dist/SHA256SUMS" ] || fail "$dist/SHA256SUMS is missing: run \`make release\`"
(cd "$dist" && sha256sum --strict -c SHA256SUMS) || fail "dist/ does not match its SHA256SUMS"
n=$(wc -l <"$dist/SHA256SUMS")
say "dist/ matches SHA256SUMS ($n files)"

tmp="$(mktemp -d "${TMPDIR:-/tmp}/vibedom-release-check.XXXXXX")"
cleanup() {
	if [ -n "${KEEP:-}" ]; then say "kept $tmp"; else rm -rf "$tmp"; fi
}
trap cleanup EXIT
cp "$dist/SHA256SUMS" "$tmp/sums"
archives=("$dist"/vibedom_*_linux_"$arch".tar.gz)
archive="${archives[0]}"
[ -f "$archive" ] || fail "no vibedom_*_linux_${arch}.tar.gz in $dist"
cp "$archive" "$tmp/tampered.tar.gz"
printf 'x' | dd of="$tmp/tampered.tar.gz" bs=1 seek=100 conv=notrunc status=none
sed -n "s|$(basename "$archive")\$|tampered.tar.gz|p" "$tmp/sums" >"$tmp/sums.t"
if (cd "$tmp" && sha256sum --status -c sums.t); then fail "a changed archive still matches SHA256SUMS"; fi

# 2. The archive, alone in an empty folder.
mkdir "$tmp/x" "$tmp/empty" "$tmp/home" "$tmp/t"
tar xzf "$archive" -C "$tmp/x"
mv "$tmp/x"/*/vibedom "$tmp/empty/vibedom"
rm -rf "$tmp/x"
bin="$tmp/empty/vibedom"
[ "$(ls -A "$tmp/empty")" = vibedom ] || fail "the empty folder holds more than vibedom"

assets="${VIBEDOM_ASSETS:-$repo/.cache/assets}"
assets="$(cd "$assets" 2>/dev/null && pwd)" || assets=""
if [ -z "$assets" ] || [ ! -d "$assets/$arch/kernel" ] || ! command -v "$qemu" >/dev/null; then
	say "SKIPPED the session: no $qemu or test kernels in ${VIBEDOM_ASSETS:-$repo/.cache/assets} (make setup)"
	exit 0
fi

# A clean environment: no Go, no repository on PATH, a fresh HOME.
vd() {
	(cd "$tmp/empty" && env -i HOME="$tmp/home" TMPDIR="$tmp/t" NO_COLOR=1 \
		PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
		VIBEDOM_ASSETS="$assets" VIBEDOM_ALPINE_MIRROR=http://127.0.0.1:9/alpine "$bin" "$@")
}

vd version --json >"$tmp/version.json" || fail "vibedom version --json"
sum=$(sed -n "s/.*\"$arch\": \"sha256:\([0-9a-f]\{64\}\)\".*/\1/p" "$tmp/version.json")
[ -n "$sum" ] || fail "vibedom version --json shows no built-in guest agent for $arch: $(cat "$tmp/version.json")"
grep -q '"alpine": "v' "$tmp/version.json" || fail "vibedom version --json shows no Alpine pin"
say "version --json: guest agent for $arch sha256:${sum:0:16}…, pins shown"

vd init >"$tmp/init.out" 2>&1 || fail "vibedom init: $(tail -n 5 "$tmp/init.out")"
say "init ok"

# 3. A session that ends in the review: without a terminal nothing is
# applied and the patch is kept; `vibedom apply` then brings it home.
ws="$tmp/ws"
mkdir -p "$ws"
printf 'one\n' >"$ws/notes.txt"
printf 'old\n' >"$ws/obsolete.txt"
code=0
vd run "$ws" --memory 512M --no-network -- sh -c \
	'set -e; cd /work; echo "from the vm" > added.txt; echo two >> notes.txt; rm obsolete.txt; uname -m' \
	</dev/null >"$tmp/run.out" 2>"$tmp/run.err" || code=$?
if [ "$code" != 0 ]; then
	# What CI prints is all there is to go on: the session's own log, the
	# VM console and the acceleration verdict, before the folder goes.
	for f in "$tmp"/home/.vibedom/logs/*/session.log "$tmp"/home/.vibedom/logs/*/console.log \
		"$tmp"/home/.cache/vibedom/qemu-accel-*.json; do
		[ -f "$f" ] || continue
		echo "release-check: --- last lines of ${f#"$tmp"/} ---" >&2
		tail -n 40 "$f" | cut -c1-400 | tr -d '\000-\010\013-\037\177' >&2
	done
	fail "vibedom run: exit $code: $(tail -n 15 "$tmp/run.err")"
fi
grep -qx "$machine" "$tmp/run.out" || fail "the guest did not run the command: $(cat "$tmp/run.out")"
grep -q "Nothing applied" "$tmp/run.err" || fail "the session did not end in the review: $(tail -n 15 "$tmp/run.err")"
[ ! -e "$ws/added.txt" ] || fail "the review applied changes without being asked"
vd apply >"$tmp/apply.out" 2>&1 </dev/null || fail "vibedom apply: $(tail -n 5 "$tmp/apply.out")"
if [ "$(cat "$ws/added.txt" 2>/dev/null)" != "from the vm" ] || [ "$(cat "$ws/notes.txt")" != "$(printf 'one\ntwo')" ] ||
	[ -e "$ws/obsolete.txt" ]; then
	fail "the applied workspace is not what the guest left"
fi
say "run + review + apply ok"

# 4. The agent the VM booted is the binary's own, extracted privately.
cache="$tmp/home/.vibedom/cache/guest-agent"
agent="$cache/vibedom-guest-linux-$arch-$sum"
[ -f "$agent" ] || fail "no extracted agent $agent: $(ls -la "$cache" 2>&1)"
[ "$(sha256sum <"$agent" | cut -d' ' -f1)" = "$sum" ] || fail "$agent does not hash to $sum"
[ "$(stat -c %a "$cache")" = 700 ] || fail "$cache is mode $(stat -c %a "$cache"), want 700"
say "the guest agent came from the binary ($agent)"
say "ok"
