#!/usr/bin/env bash
# go test -exec wrapper for macOS: signs the test binary with the
# virtualization entitlement (ad hoc), then runs it. Without the entitlement
# Virtualization.framework refuses to create machines.
#
#   go test -exec "$PWD/scripts/codesign-exec.sh" ./vm/vz/...
set -euo pipefail
bin="$1"
shift
ent="$(cd "$(dirname "$0")/.." && pwd)/entitlements.plist"
codesign --force --entitlements "$ent" -s - "$bin" >/dev/null 2>&1 || {
	echo "codesign-exec: could not sign $bin (is Xcode's command line tools installed?)" >&2
	exit 1
}
exec "$bin" "$@"
