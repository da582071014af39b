// The mixin's settings. Override any of them when importing the mixin:
//
//   (import 'mixin.libsonnet') + { _config+:: { clusterLabel: 'k8s_cluster', showMultiCluster: true } }
//
// or through the build script: `build.sh OUT '{showMultiCluster: true}'`.
{
  _config+:: {
    // The exporter's scrape job, as the alerts on its scrapes (`up`) select it.
    hvstatsSelector: 'job="hvstats"',
    // The label that names a cluster (a Prometheus server's global.external_labels, or what a
    // central Prometheus receiving remote writes is sent). hvstats never sets it: every
    // recording rule keeps it, and every alert's join matches on it.
    clusterLabel: 'cluster',
    // Shows the dashboard's cluster variable. Hidden, it stays at All (every series, with a
    // cluster label or none), so one dashboard serves a single Prometheus and a fleet.
    showMultiCluster: false,
    // The rate window of the recording rules: at least four scrapes at the README's 15 s scrape
    // interval. The rule names say 1m.
    rateInterval: '1m',
    // The dashboard's identity in Grafana.
    dashboardUid: 'hvstats-fleet',
    dashboardTitle: 'hvstats: KVM VMs by host, VM and VP',
  },
}
