#!/usr/bin/env bash
# A real vibedom session on Linux: copies examples/sample-app to a temporary
# folder (a git repository, so you can look at the result with git), boots a
# QEMU VM on the copy, runs a scripted "agent" inside it and ends in the
# review prompt, where you choose what reaches the copy.
#
#   scripts/demo.sh            scripted agent (edits, adds, deletes files)
#   DEMO_SHELL=1 scripts/demo.sh   an interactive shell in the VM instead
#
# `make demo` runs scripts/setup.sh and builds bin/ first. The demo uses a
# throwaway vibedom home ($DEMO_HOME, default under the temporary folder)
# so it never touches ~/.vibedom; both are kept so you can look around.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
bin="$repo/bin/vibedom"
if [ ! -x "$bin" ]; then
	echo "demo: $bin is missing: run \`make build guest\` (or \`make demo\`) first" >&2
	exit 1
fi

tmp="$(mktemp -d "${TMPDIR:-/tmp}/vibedom-demo.XXXXXX")"
app="$tmp/sample-app"
cp -R "$repo/examples/sample-app" "$app"
git -C "$app" init -q
git -C "$app" add -A
git -C "$app" -c user.name=demo -c user.email=demo@example.invalid commit -q -m "sample app"
export VIBEDOM_HOME="${DEMO_HOME:-$tmp/home}"
# The test kernels fetched by scripts/fetch-assets.sh live in the repository.
export VIBEDOM_ASSETS="${VIBEDOM_ASSETS:-$repo/.cache/assets}"

echo "demo: project copy $app"
echo "demo: vibedom home  $VIBEDOM_HOME"
"$bin" init >/dev/null

if [ -n "${DEMO_SHELL:-}" ]; then
	echo "demo: starting a shell in the VM; edit files in /work, then exit to review"
	exec "$bin" run "$app" --no-network
fi

# The scripted agent: what a coding agent would do to this project.
agent='set -e
cd /work
echo "agent: uid $(id -u) on $(uname -sm); /mnt/workspace is read-only:"
touch /mnt/workspace/probe 2>&1 | sed "s/^/agent:   /" || true
cat > greet.sh <<'"'"'SH'"'"'
#!/bin/sh
# Prints a greeting for each name given; --shout prints it in capitals.
shout=
if [ "${1:-}" = --shout ]; then shout=1; shift; fi
for name in "$@"; do
	msg="Hello, $name!"
	if [ -n "$shout" ]; then msg=$(echo "$msg" | tr a-z A-Z); fi
	echo "$msg"
done
SH
cat > test.sh <<'"'"'SH'"'"'
#!/bin/sh
set -e
[ "$(./greet.sh Ada)" = "Hello, Ada!" ]
[ "$(./greet.sh --shout Ada)" = "HELLO, ADA!" ]
echo ok
SH
chmod +x greet.sh test.sh
rm obsolete.txt
sed -i "s/^- add a --shout flag to greet.sh$/- [done] add a --shout flag to greet.sh/; s/^- write a test$/- [done] write a test/" notes.txt
echo "agent: tests: $(./test.sh)"
echo "agent: done; the host now shows you what changed"'

"$bin" run "$app" --no-network -- sh -c "$agent" || code=$?
echo
echo "demo: the project copy is $app"
echo "demo: \`git -C $app status\` shows what you applied; \`$bin undo\` (with VIBEDOM_HOME=$VIBEDOM_HOME) takes it back"
exit "${code:-0}"
