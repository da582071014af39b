// The hvstats dashboard: fleet, then host, VM and VP, then the halt histograms. Plain Grafana
// JSON (no grafonnet): the panels are panels.libsonnet; here every query is scoped to the
// cluster variable, and the variables are listed.
{
  grafanaDashboards+:: {
    local c = $._config,
    local cluster = c.clusterLabel,
    // Each query of the panels, scoped to the cluster variable; an aggregation that keeps the
    // host keeps its cluster too (two clusters may each have a host of one name).
    local scoped(expr) =
      std.strReplace(
        std.strReplace(expr, '{job=~"$job"', '{%s=~"$cluster",job=~"$job"' % cluster),
        'by (instance',
        'by (%s, instance' % cluster
      ),
    // Legends name the cluster of a host where the cluster variable is shown.
    local legend(format) =
      if c.showMultiCluster && std.startsWith(format, '{{instance}}')
      then '{{%s}} %s' % [cluster, format]
      else format,
    local target(t) =
      t { expr: scoped(t.expr) }
      + (if std.objectHas(t, 'legendFormat') then { legendFormat: legend(t.legendFormat) } else {}),
    local panel(p) = p + (if std.objectHas(p, 'targets') then { targets: std.map(target, p.targets) } else {}),
    // A query variable of Grafana: multi-valued, with All (every value, or none: `.*`).
    local variable(name, label, query, hide=0) = {
      name: name,
      label: label,
      type: 'query',
      datasource: { type: 'prometheus', uid: '${datasource}' },
      query: { query: query, refId: 'PrometheusVariableQueryEditor-VariableQuery', qryType: 1 },
      definition: query,
      refresh: 2,
      sort: 1,
      multi: true,
      includeAll: true,
      allValue: '.*',
      current: {},
      options: [],
      hide: hide,
      regex: '',
    },

    'hvstats.json': {
      uid: c.dashboardUid,
      title: c.dashboardTitle,
      description: 'Exits, CPU wait, time halted and hypercalls of every VM hvstats exports: fleet, then host, VM and VP, then the halt histograms. Needs the recording rules of packaging/prometheus/hvstats.rules.yml; the histograms row needs `hvstats serve --collector.histograms` (or native histograms over protobuf). Generated from packaging/mixin.',
      tags: ['hvstats', 'kvm', 'hyper-v'],
      editable: true,
      graphTooltip: 1,
      schemaVersion: 39,
      version: 1,
      refresh: '30s',
      time: { from: 'now-1h', to: 'now' },
      timepicker: {},
      timezone: '',
      fiscalYearStartMonth: 0,
      liveNow: false,
      weekStart: '',
      links: [],
      annotations: {
        list: [
          {
            builtIn: 1,
            datasource: { type: 'grafana', uid: '-- Grafana --' },
            enable: true,
            hide: true,
            iconColor: 'rgba(0, 211, 255, 1)',
            name: 'Annotations & Alerts',
            type: 'dashboard',
          },
        ],
      },
      templating: {
        list: [
          {
            name: 'datasource',
            label: 'Data source',
            type: 'datasource',
            query: 'prometheus',
            current: {},
            hide: 0,
            includeAll: false,
            multi: false,
            options: [],
            refresh: 1,
            regex: '',
          },
          // $cluster, whatever the label's name. Hidden (2) unless showMultiCluster: it stays at
          // All, which matches series with no cluster label too.
          variable('cluster', 'Cluster', 'label_values(hvstats_build_info, %s)' % cluster, if c.showMultiCluster then 0 else 2)
          + { current: { selected: true, text: ['All'], value: ['$__all'] } },
          variable('job', 'Job', 'label_values(hvstats_build_info{%s=~"$cluster"}, job)' % cluster),
          variable('instance', 'Host', scoped('label_values(hvstats_build_info{job=~"$job"}, instance)')),
          variable('vm', 'VM', scoped('label_values(hvstats_vm_info{job=~"$job",instance=~"$instance"}, vm)')),
          variable('vp', 'VP', scoped('label_values(hvstats_vp_total_run_seconds_total{job=~"$job",instance=~"$instance",vm=~"$vm"}, vp)')),
        ],
      },
      panels: std.map(panel, import 'panels.libsonnet'),
    },
  },
}
