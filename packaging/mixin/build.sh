#!/bin/sh
# Renders the mixin into OUT (default: packaging/, the files shipped and checked in):
# OUT/prometheus/hvstats.rules.yml, OUT/prometheus/hvstats.alerts.yml, OUT/grafana/hvstats.json.
# A second argument overrides _config, e.g. build.sh /tmp/fleet '{showMultiCluster: true}'.
# Needs jsonnet (Debian's package jsonnet).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-$here/..}
config=${2:-{\}}
mkdir -p "$out/prometheus" "$out/grafana"
jsonnet -S -m "$out" -J "$here" --tla-code "config=$config" "$here/prometheus.jsonnet" >/dev/null
jsonnet -J "$here" --tla-code "config=$config" "$here/grafana.jsonnet" >"$out/grafana/hvstats.json"
