#!/usr/bin/env bash
# Points vibedom.rb at a release: update.sh v1.2.3 path/to/SHA256SUMS
# (the SHA256SUMS attached to that GitHub release).
set -euo pipefail
tag="$1" sums="$2"
ver="${tag#v}"
here="$(cd "$(dirname "$0")" && pwd)"
sum="$(awk -v f="vibedom_${ver}_darwin_arm64.tar.gz" '$2 == f {print $1}' "$sums")"
if [ -z "$sum" ]; then
	echo "update.sh: $sums has no vibedom_${ver}_darwin_arm64.tar.gz (was the release built on macOS?)" >&2
	exit 1
fi
sed -i.bak -E \
	-e "s|releases/download/v[^/]+/vibedom_[^_]+_darwin_arm64.tar.gz|releases/download/${tag}/vibedom_${ver}_darwin_arm64.tar.gz|" \
	-e "s|^  sha256 \"[0-9a-f]{64}\"|  sha256 \"${sum}\"|" "$here/vibedom.rb"
rm -f "$here/vibedom.rb.bak"
echo "vibedom.rb now installs ${tag} (${sum})"
