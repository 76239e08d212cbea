#!/usr/bin/env bash
# Type-checks every dashboards/*.json against Grafana's dashboard model (@grafana/schema, pinned in
# package.json and package-lock.json) with tsc. Installs the pinned packages with `npm ci` when
# node_modules is missing or older than the lock file. Needs node and npm.
set -euo pipefail
cd "$(dirname "$0")"

for tool in node npm; do
  command -v "$tool" >/dev/null 2>&1 || {
    echo "check.sh: $tool is not installed (Debian: apt-get install nodejs npm)" >&2
    exit 2
  }
done
# npm writes node_modules/.package-lock.json on every install: older than the lock, it is stale.
if [ ! -f node_modules/.package-lock.json ] ||
  [ package-lock.json -nt node_modules/.package-lock.json ] ||
  [ package.json -nt node_modules/.package-lock.json ]; then
  echo "== npm ci (dashboards/typecheck)"
  npm ci --no-audit --no-fund --loglevel=error
fi
node generate.mjs
npx --no-install tsc --noEmit -p .
echo "dashboards type-check against @grafana/schema $(node -p 'require("@grafana/schema/package.json").version') (tsc $(npx --no-install tsc --version))"
