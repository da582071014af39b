// The mixin's Prometheus files, by path under packaging/ (`jsonnet -S -m OUT prometheus.jsonnet`,
// or build.sh). `config` overrides _config: `--tla-code config='{showMultiCluster: true}'`.
function(config={})
  local mixin = (import 'mixin.libsonnet') + { _config+:: config };
  local header(what) =
    '# %s, generated from packaging/mixin (its _config: config.libsonnet)\n' % what
    + '# by packaging/mixin/build.sh: edit the jsonnet, not this file.\n#\n'
    + '#   promtool check rules hvstats.rules.yml hvstats.alerts.yml\n'
    + '#   promtool test rules hvstats.test.yml\n';
  local yaml(v) = (import 'yaml.libsonnet').rules(v);
  {
    'prometheus/hvstats.rules.yml': header('Recording rules for hvstats') + yaml(mixin.prometheusRules),
    'prometheus/hvstats.alerts.yml': header('Alerts for hvstats (over hvstats.rules.yml)') + yaml(mixin.prometheusAlerts),
  }
