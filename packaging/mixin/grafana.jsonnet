// The mixin's dashboard, packaging/grafana/hvstats.json (`jsonnet grafana.jsonnet`, or
// build.sh). `config` overrides _config: `--tla-code config='{showMultiCluster: true}'`.
function(config={})
  ((import 'mixin.libsonnet') + { _config+:: config }).grafanaDashboards['hvstats.json']
