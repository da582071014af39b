// The hvstats monitoring mixin: recording rules, alerts and a dashboard, from one _config
// (config.libsonnet). build.sh renders the files shipped in packaging/prometheus and
// packaging/grafana.
(import 'config.libsonnet') +
(import 'rules/rules.libsonnet') +
(import 'alerts/alerts.libsonnet') +
(import 'dashboards/hvstats.libsonnet')
