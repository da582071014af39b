// The dashboard's panels, as Grafana reads them. Every query selects `{job=~"$job"...}`;
// hvstats.libsonnet scopes each to the cluster variable (_config.clusterLabel).
[
  {
    id: 1,
    type: 'row',
    title: 'Fleet',
    collapsed: false,
    gridPos: {
      h: 1,
      w: 24,
      x: 0,
      y: 0,
    },
    panels: [],
  },
  {
    id: 2,
    type: 'stat',
    title: 'Hosts exporting',
    description: 'hvstats exporters Prometheus scrapes and reaches.',
    datasource: {
      type: 'prometheus',
      uid: '${datasource}',
    },
    gridPos: {
      h: 4,
      w: 4,
      x: 0,
      y: 1,
    },
    targets: [
      {
        datasource: {
          type: 'prometheus',
          uid: '${datasource}',
        },
        refId: 'A',
        expr: 'count(up{job=~"$job"} == 1)',
        legendFormat: '',
        instant: true,
        range: false,
      },
    ],
    fieldConfig: {
      defaults: {
        unit: 'short',
        thresholds: {
          mode: 'absolute',
          steps: [
            {
              color: 'red',
              value: null,
            },
            {
              color: 'green',
              value: 1,
            },
          ],
        },
        color: {
          mode: 'thresholds',
        },
      },
      overrides: [],
    },
    options: {
      reduceOptions: {
        calcs: [
          'lastNotNull',
        ],
        fields: '',
        values: false,
      },
      colorMode: 'value',
      graphMode: 'none',
      textMode: 'auto',
    },
  },
  {
    id: 3,
    type: 'stat',
    title: 'VMs',
    description: 'VMs whose counters the last scrape of each host read.',
    datasource: {
      type: 'prometheus',
      uid: '${datasource}',
    },
    gridPos: {
      h: 4,
      w: 4,
      x: 4,
      y: 1,
    },
    targets: [
      {
        datasource: {
          type: 'prometheus',
          uid: '${datasource}',
        },
        refId: 'A',
        expr: 'sum(instance:hvstats_vms_up:count{job=~"$job"})',
        legendFormat: '',
        instant: true,
        range: false,
      },
    ],
    fieldConfig: {
      defaults: {
        unit: 'short',
        thresholds: {
          mode: 'absolute',
          steps: [
            {
              color: 'green',
              value: null,
            },
          ],
        },
        color: {
          mode: 'thresholds',
        },
      },
      overrides: [],
    },
    options: {
      reduceOptions: {
        calcs: [
          'lastNotNull',
        ],
        fields: '',
        values: false,
      },
      colorMode: 'value',
      graphMode: 'none',
      textMode: 'auto',
    },
  },
  {
    id: 4,
    type: 'stat',
    title: 'Exits per second',
    description: 'Exits per second over the fleet (orange from 100,000/s, the rate one vCPU in an exit storm makes).',
    datasource: {
      type: 'prometheus',
      uid: '${datasource}',
    },
    gridPos: {
      h: 4,
      w: 4,
      x: 8,
      y: 1,
    },
    targets: [
      {
        datasource: {
          type: 'prometheus',
          uid: '${datasource}',
        },
        refId: 'A',
        expr: 'sum(instance:hvstats_exits:rate1m{job=~"$job"})',
        legendFormat: '',
        instant: true,
        range: false,
      },
    ],
    fieldConfig: {
      defaults: {
        unit: 'ops',
        thresholds: {
          mode: 'absolute',
          steps: [
            {
              color: 'green',
              value: null,
            },
            {
              color: 'orange',
              value: 100000,
            },
          ],
        },
        color: {
          mode: 'thresholds',
        },
      },
      overrides: [],
    },
    options: {
      reduceOptions: {
        calcs: [
          'lastNotNull',
        ],
        fields: '',
        values: false,
      },
      colorMode: 'value',
      graphMode: 'none',
      textMode: 'auto',
    },
  },
  {
    id: 5,
    type: 'stat',
    title: 'CPU wait',
    description: "Of the time the fleet's vCPUs wanted a host CPU (run + wait), the share they waited for one: yellow from 5 %, red from 10 %, the CPU-wait alert's threshold.",
    datasource: {
      type: 'prometheus',
      uid: '${datasource}',
    },
    gridPos: {
      h: 4,
      w: 4,
      x: 12,
      y: 1,
    },
    targets: [
      {
        datasource: {
          type: 'prometheus',
          uid: '${datasource}',
        },
        refId: 'A',
        expr: 'sum(instance:hvstats_cpu_wait_seconds:rate1m{job=~"$job"}) / clamp_min(sum(instance:hvstats_cpu_wait_seconds:rate1m{job=~"$job"}) + sum(instance:hvstats_run_seconds:rate1m{job=~"$job"}), 1e-9)',
        legendFormat: '',
        instant: true,
        range: false,
      },
    ],
    fieldConfig: {
      defaults: {
        unit: 'percentunit',
        thresholds: {
          mode: 'absolute',
          steps: [
            {
              color: 'green',
              value: null,
            },
            {
              color: 'yellow',
              value: 0.05,
            },
            {
              color: 'red',
              value: 0.1,
            },
          ],
        },
        color: {
          mode: 'thresholds',
        },
      },
      overrides: [],
    },
    options: {
      reduceOptions: {
        calcs: [
          'lastNotNull',
        ],
        fields: '',
        values: false,
      },
      colorMode: 'value',
      graphMode: 'none',
      textMode: 'auto',
    },
  },
  {
    id: 6,
    type: 'stat',
    title: 'Exporter read errors',
    description: 'Instances or pages each exporter could not read at its last scrape (red from 1).',
    datasource: {
      type: 'prometheus',
      uid: '${datasource}',
    },
    gridPos: {
      h: 4,
      w: 4,
      x: 16,
      y: 1,
    },
    targets: [
      {
        datasource: {
          type: 'prometheus',
          uid: '${datasource}',
        },
        refId: 'A',
        expr: 'sum by (instance) (hvstats_read_errors{job=~"$job"})',
        legendFormat: '{{instance}}',
        instant: true,
        range: false,
      },
    ],
    fieldConfig: {
      defaults: {
        unit: 'short',
        thresholds: {
          mode: 'absolute',
          steps: [
            {
              color: 'green',
              value: null,
            },
            {
              color: 'red',
              value: 1,
            },
          ],
        },
        color: {
          mode: 'thresholds',
        },
      },
      overrides: [],
    },
    options: {
      reduceOptions: {
        calcs: [
          'lastNotNull',
        ],
        fields: '',
        values: false,
      },
      colorMode: 'value',
      graphMode: 'none',
      textMode: 'auto',
    },
  },
  {
    id: 7,
    type: 'stat',
    title: 'Observers up',
    description: "Each observer's health: 1 while it refreshes its VMs, 0 once it stopped (red). A host without any is alerted (HvstatsObserverAbsent).",
    datasource: {
      type: 'prometheus',
      uid: '${datasource}',
    },
    gridPos: {
      h: 4,
      w: 4,
      x: 20,
      y: 1,
    },
    targets: [
      {
        datasource: {
          type: 'prometheus',
          uid: '${datasource}',
        },
        refId: 'A',
        expr: 'hvstats_observer_up{job=~"$job"}',
        legendFormat: '{{instance}} {{publisher}}',
        instant: true,
        range: false,
      },
    ],
    fieldConfig: {
      defaults: {
        unit: 'short',
        thresholds: {
          mode: 'absolute',
          steps: [
            {
              color: 'red',
              value: null,
            },
            {
              color: 'green',
              value: 1,
            },
          ],
        },
        color: {
          mode: 'thresholds',
        },
      },
      overrides: [],
    },
    options: {
      reduceOptions: {
        calcs: [
          'lastNotNull',
        ],
        fields: '',
        values: false,
      },
      colorMode: 'value',
      graphMode: 'none',
      textMode: 'auto',
    },
  },
  {
    id: 8,
    type: 'timeseries',
    title: 'Exits per second by host',
    description: 'Every exit of every VM of each host.',
    datasource: {
      type: 'prometheus',
      uid: '${datasource}',
    },
    gridPos: {
      h: 8,
      w: 12,
      x: 0,
      y: 5,
    },
    targets: [
      {
        datasource: {
          type: 'prometheus',
          uid: '${datasource}',
        },
        refId: 'A',
        expr: 'instance:hvstats_exits:rate1m{job=~"$job"}',
        legendFormat: '{{instance}}',
      },
    ],
    fieldConfig: {
      defaults: {
        unit: 'ops',
        custom: {
          stacking: {
            mode: 'none',
            group: 'A',
          },
          fillOpacity: 10,
          lineWidth: 1,
        },
      },
      overrides: [],
    },
    options: {
      legend: {
        displayMode: 'table',
        placement: 'right',
        calcs: [
          'mean',
          'max',
        ],
      },
      tooltip: {
        mode: 'multi',
        sort: 'desc',
      },
    },
  },
  {
    id: 9,
    type: 'timeseries',
    title: 'CPU wait by host',
    description: "Of the time each host's vCPUs wanted a CPU, the share they waited.",
    datasource: {
      type: 'prometheus',
      uid: '${datasource}',
    },
    gridPos: {
      h: 8,
      w: 12,
      x: 12,
      y: 5,
    },
    targets: [
      {
        datasource: {
          type: 'prometheus',
          uid: '${datasource}',
        },
        refId: 'A',
        expr: 'instance:hvstats_cpu_wait:ratio1m{job=~"$job"}',
        legendFormat: '{{instance}}',
      },
    ],
    fieldConfig: {
      defaults: {
        unit: 'percentunit',
        custom: {
          stacking: {
            mode: 'none',
            group: 'A',
          },
          fillOpacity: 10,
          lineWidth: 1,
        },
      },
      overrides: [],
    },
    options: {
      legend: {
        displayMode: 'table',
        placement: 'right',
        calcs: [
          'mean',
          'max',
        ],
      },
      tooltip: {
        mode: 'multi',
        sort: 'desc',
      },
    },
  },
  {
    id: 10,
    type: 'table',
    title: 'Busiest VMs',
    description: 'The 10 VMs of the fleet that exit most, now.',
    datasource: {
      type: 'prometheus',
      uid: '${datasource}',
    },
    gridPos: {
      h: 8,
      w: 8,
      x: 0,
      y: 13,
    },
    targets: [
      {
        datasource: {
          type: 'prometheus',
          uid: '${datasource}',
        },
        refId: 'A',
        expr: 'topk(10, vm:hvstats_exits:rate1m{job=~"$job"})',
        legendFormat: '',
        instant: true,
        range: false,
        format: 'table',
      },
    ],
    fieldConfig: {
      defaults: {
        unit: 'ops',
      },
      overrides: [],
    },
    options: {
      showHeader: true,
    },
  },
  {
    id: 11,
    type: 'table',
    title: 'VMs waiting most for a CPU',
    description: 'The 10 VMs whose vCPUs wait most for a host CPU, now.',
    datasource: {
      type: 'prometheus',
      uid: '${datasource}',
    },
    gridPos: {
      h: 8,
      w: 8,
      x: 8,
      y: 13,
    },
    targets: [
      {
        datasource: {
          type: 'prometheus',
          uid: '${datasource}',
        },
        refId: 'A',
        expr: 'topk(10, vm:hvstats_cpu_wait:ratio1m{job=~"$job"})',
        legendFormat: '',
        instant: true,
        range: false,
        format: 'table',
      },
    ],
    fieldConfig: {
      defaults: {
        unit: 'percentunit',
      },
      overrides: [],
    },
    options: {
      showHeader: true,
    },
  },
  {
    id: 12,
    type: 'stat',
    title: 'VMs by state',
    description: 'VMs in each state their VMM reports (QMP query-status where there is one).',
    datasource: {
      type: 'prometheus',
      uid: '${datasource}',
    },
    gridPos: {
      h: 8,
      w: 8,
      x: 16,
      y: 13,
    },
    targets: [
      {
        datasource: {
          type: 'prometheus',
          uid: '${datasource}',
        },
        refId: 'A',
        expr: 'count by (state) (hvstats_vm_state{job=~"$job"} == 1)',
        legendFormat: '{{state}}',
        instant: true,
        range: false,
      },
    ],
    fieldConfig: {
      defaults: {
        unit: 'short',
        thresholds: {
          mode: 'absolute',
          steps: [
            {
              color: 'green',
              value: null,
            },
          ],
        },
        color: {
          mode: 'thresholds',
        },
      },
      overrides: [],
    },
    options: {
      reduceOptions: {
        calcs: [
          'lastNotNull',
        ],
        fields: '',
        values: false,
      },
      colorMode: 'value',
      graphMode: 'none',
      textMode: 'auto',
    },
  },
  {
    id: 13,
    type: 'stat',
    title: 'Observer refresh age',
    description: "Seconds since each observer last refreshed its VMs: yellow from 30 s, red from 60 s, the stale-observer alert's threshold.",
    datasource: {
      type: 'prometheus',
      uid: '${datasource}',
    },
    gridPos: {
      h: 8,
      w: 8,
      x: 0,
      y: 21,
    },
    targets: [
      {
        datasource: {
          type: 'prometheus',
          uid: '${datasource}',
        },
        refId: 'A',
        expr: 'time() - hvstats_observer_last_refresh_timestamp_seconds{job=~"$job"}',
        legendFormat: '{{instance}}',
        instant: true,
        range: false,
      },
    ],
    fieldConfig: {
      defaults: {
        unit: 's',
        thresholds: {
          mode: 'absolute',
          steps: [
            {
              color: 'green',
              value: null,
            },
            {
              color: 'yellow',
              value: 30,
            },
            {
              color: 'red',
              value: 60,
            },
          ],
        },
        color: {
          mode: 'thresholds',
        },
      },
      overrides: [],
    },
    options: {
      reduceOptions: {
        calcs: [
          'lastNotNull',
        ],
        fields: '',
        values: false,
      },
      colorMode: 'value',
      graphMode: 'none',
      textMode: 'auto',
    },
  },
  {
    id: 14,
    type: 'timeseries',
    title: 'VMs attached and refused by observers',
    description: 'VMs each observer counts, and those it found but could not attach to.',
    datasource: {
      type: 'prometheus',
      uid: '${datasource}',
    },
    gridPos: {
      h: 8,
      w: 8,
      x: 8,
      y: 21,
    },
    targets: [
      {
        datasource: {
          type: 'prometheus',
          uid: '${datasource}',
        },
        refId: 'A',
        expr: 'hvstats_observer_vms{job=~"$job"}',
        legendFormat: '{{instance}} {{state}}',
      },
    ],
    fieldConfig: {
      defaults: {
        unit: 'short',
        custom: {
          stacking: {
            mode: 'none',
            group: 'A',
          },
          fillOpacity: 10,
          lineWidth: 1,
        },
      },
      overrides: [],
    },
    options: {
      legend: {
        displayMode: 'table',
        placement: 'right',
        calcs: [
          'mean',
          'max',
        ],
      },
      tooltip: {
        mode: 'multi',
        sort: 'desc',
      },
    },
  },
  {
    id: 15,
    type: 'stat',
    title: 'QMP sessions up',
    description: "QMP sessions each observer holds to its VMs' QEMUs.",
    datasource: {
      type: 'prometheus',
      uid: '${datasource}',
    },
    gridPos: {
      h: 8,
      w: 8,
      x: 16,
      y: 21,
    },
    targets: [
      {
        datasource: {
          type: 'prometheus',
          uid: '${datasource}',
        },
        refId: 'A',
        expr: 'hvstats_observer_qmp_sessions_up{job=~"$job"}',
        legendFormat: '{{instance}}',
        instant: true,
        range: false,
      },
    ],
    fieldConfig: {
      defaults: {
        unit: 'short',
        thresholds: {
          mode: 'absolute',
          steps: [
            {
              color: 'blue',
              value: null,
            },
          ],
        },
        color: {
          mode: 'thresholds',
        },
      },
      overrides: [],
    },
    options: {
      reduceOptions: {
        calcs: [
          'lastNotNull',
        ],
        fields: '',
        values: false,
      },
      colorMode: 'value',
      graphMode: 'none',
      textMode: 'auto',
    },
  },
  {
    id: 16,
    type: 'row',
    title: 'Host: $instance',
    collapsed: false,
    gridPos: {
      h: 1,
      w: 24,
      x: 0,
      y: 29,
    },
    panels: [],
  },
  {
    id: 17,
    type: 'timeseries',
    title: 'Exits per second by VM',
    description: 'Every exit of each VM of the selected hosts, stacked.',
    datasource: {
      type: 'prometheus',
      uid: '${datasource}',
    },
    gridPos: {
      h: 8,
      w: 12,
      x: 0,
      y: 30,
    },
    targets: [
      {
        datasource: {
          type: 'prometheus',
          uid: '${datasource}',
        },
        refId: 'A',
        expr: 'vm:hvstats_exits:rate1m{job=~"$job",instance=~"$instance"}',
        legendFormat: '{{instance}} {{vm}}',
      },
    ],
    fieldConfig: {
      defaults: {
        unit: 'ops',
        custom: {
          stacking: {
            mode: 'normal',
            group: 'A',
          },
          fillOpacity: 30,
          lineWidth: 1,
        },
      },
      overrides: [],
    },
    options: {
      legend: {
        displayMode: 'table',
        placement: 'right',
        calcs: [
          'mean',
          'max',
        ],
      },
      tooltip: {
        mode: 'multi',
        sort: 'desc',
      },
    },
  },
  {
    id: 18,
    type: 'timeseries',
    title: 'Intercepts by class, and all exits',
    description: "The selected hosts' intercepts by class of the WHv Intercepts set, each a line (not stacked), and all their exits (the thick line). On VMX/SVM hosts each class is a part of the exits. Under KVM's instruction emulator (a host without VMX/SVM) KVM's exits count only the exits to the VMM and the halts: an I/O instruction, CPUID or MSR access KVM handles in the kernel (the PIT, the PIC) is counted in its class but is no exit, so there the classes can add up to more than the exits (an idle SeaBIOS VM: 55 I/O + 18 HLT a second against 58 exits). Emulated instructions are not exits: see their own panel.",
    datasource: {
      type: 'prometheus',
      uid: '${datasource}',
    },
    gridPos: {
      h: 8,
      w: 12,
      x: 12,
      y: 30,
    },
    targets: [
      {
        datasource: {
          type: 'prometheus',
          uid: '${datasource}',
        },
        refId: 'A',
        expr: 'instance_intercept:hvstats_intercepts:rate1m{job=~"$job",instance=~"$instance"}',
        legendFormat: '{{instance}} {{intercept}}',
      },
      {
        datasource: {
          type: 'prometheus',
          uid: '${datasource}',
        },
        refId: 'B',
        expr: 'instance:hvstats_exits:rate1m{job=~"$job",instance=~"$instance"}',
        legendFormat: '{{instance}} all exits',
      },
    ],
    fieldConfig: {
      defaults: {
        unit: 'ops',
        custom: {
          stacking: {
            mode: 'none',
            group: 'A',
          },
          fillOpacity: 0,
          lineWidth: 1,
        },
      },
      overrides: [
        {
          matcher: {
            id: 'byFrameRefID',
            options: 'B',
          },
          properties: [
            {
              id: 'custom.lineWidth',
              value: 3,
            },
          ],
        },
      ],
    },
    options: {
      legend: {
        displayMode: 'table',
        placement: 'right',
        calcs: [
          'mean',
          'max',
        ],
      },
      tooltip: {
        mode: 'multi',
        sort: 'desc',
      },
    },
  },
  {
    id: 19,
    type: 'timeseries',
    title: 'CPU wait by VM',
    description: "Of the time each VM's vCPUs wanted a host CPU, the share they waited.",
    datasource: {
      type: 'prometheus',
      uid: '${datasource}',
    },
    gridPos: {
      h: 8,
      w: 8,
      x: 0,
      y: 38,
    },
    targets: [
      {
        datasource: {
          type: 'prometheus',
          uid: '${datasource}',
        },
        refId: 'A',
        expr: 'vm:hvstats_cpu_wait:ratio1m{job=~"$job",instance=~"$instance"}',
        legendFormat: '{{instance}} {{vm}}',
      },
    ],
    fieldConfig: {
      defaults: {
        unit: 'percentunit',
        custom: {
          stacking: {
            mode: 'none',
            group: 'A',
          },
          fillOpacity: 10,
          lineWidth: 1,
        },
      },
      overrides: [],
    },
    options: {
      legend: {
        displayMode: 'table',
        placement: 'right',
        calcs: [
          'mean',
          'max',
        ],
      },
      tooltip: {
        mode: 'multi',
        sort: 'desc',
      },
    },
  },
  {
    id: 20,
    type: 'timeseries',
    title: 'Host CPUs running each VM',
    description: "CPU seconds per second the VM's vCPU threads ran: host CPUs busy with it.",
    datasource: {
      type: 'prometheus',
      uid: '${datasource}',
    },
    gridPos: {
      h: 8,
      w: 8,
      x: 8,
      y: 38,
    },
    targets: [
      {
        datasource: {
          type: 'prometheus',
          uid: '${datasource}',
        },
        refId: 'A',
        expr: 'vm:hvstats_run_seconds:rate1m{job=~"$job",instance=~"$instance"}',
        legendFormat: '{{instance}} {{vm}}',
      },
    ],
    fieldConfig: {
      defaults: {
        unit: 'short',
        custom: {
          stacking: {
            mode: 'normal',
            group: 'A',
          },
          fillOpacity: 30,
          lineWidth: 1,
        },
      },
      overrides: [],
    },
    options: {
      legend: {
        displayMode: 'table',
        placement: 'right',
        calcs: [
          'mean',
          'max',
        ],
      },
      tooltip: {
        mode: 'multi',
        sort: 'desc',
      },
    },
  },
  {
    id: 21,
    type: 'timeseries',
    title: 'Hypercalls per second by VM',
    description: "Hypercalls of each VM's guest.",
    datasource: {
      type: 'prometheus',
      uid: '${datasource}',
    },
    gridPos: {
      h: 8,
      w: 8,
      x: 16,
      y: 38,
    },
    targets: [
      {
        datasource: {
          type: 'prometheus',
          uid: '${datasource}',
        },
        refId: 'A',
        expr: 'vm:hvstats_hypercalls:rate1m{job=~"$job",instance=~"$instance"}',
        legendFormat: '{{instance}} {{vm}}',
      },
    ],
    fieldConfig: {
      defaults: {
        unit: 'ops',
        custom: {
          stacking: {
            mode: 'none',
            group: 'A',
          },
          fillOpacity: 10,
          lineWidth: 1,
        },
      },
      overrides: [],
    },
    options: {
      legend: {
        displayMode: 'table',
        placement: 'right',
        calcs: [
          'mean',
          'max',
        ],
      },
      tooltip: {
        mode: 'multi',
        sort: 'desc',
      },
    },
  },
  {
    id: 22,
    type: 'table',
    title: 'VMs on the host',
    description: 'Each VM: its publisher (hvstats run, or the observer), its VMM and pid, its UUID.',
    datasource: {
      type: 'prometheus',
      uid: '${datasource}',
    },
    gridPos: {
      h: 8,
      w: 8,
      x: 0,
      y: 46,
    },
    targets: [
      {
        datasource: {
          type: 'prometheus',
          uid: '${datasource}',
        },
        refId: 'A',
        expr: 'hvstats_vm_info{job=~"$job",instance=~"$instance"}',
        legendFormat: '',
        instant: true,
        range: false,
        format: 'table',
      },
    ],
    fieldConfig: {
      defaults: {
        unit: 'short',
      },
      overrides: [],
    },
    options: {
      showHeader: true,
    },
  },
  {
    id: 40,
    type: 'timeseries',
    title: 'Emulated instructions per second by VM',
    description: 'Instructions KVM emulated for each VM of the selected hosts (MMIO, port string I/O, real mode): not exits, and not part of the exits by reason (one exit may emulate many, or none).',
    datasource: {
      type: 'prometheus',
      uid: '${datasource}',
    },
    gridPos: {
      h: 8,
      w: 8,
      x: 8,
      y: 46,
    },
    targets: [
      {
        datasource: {
          type: 'prometheus',
          uid: '${datasource}',
        },
        refId: 'A',
        expr: 'vm:hvstats_emulated_instructions:rate1m{job=~"$job",instance=~"$instance"}',
        legendFormat: '{{instance}} {{vm}}',
      },
    ],
    fieldConfig: {
      defaults: {
        unit: 'ops',
        custom: {
          stacking: {
            mode: 'none',
            group: 'A',
          },
          fillOpacity: 10,
          lineWidth: 1,
        },
      },
      overrides: [],
    },
    options: {
      legend: {
        displayMode: 'table',
        placement: 'right',
        calcs: [
          'mean',
          'max',
        ],
      },
      tooltip: {
        mode: 'multi',
        sort: 'desc',
      },
    },
  },
  {
    id: 23,
    type: 'state-timeline',
    title: 'Counter sources up',
    description: 'For each observed VM, each counter source (1 up, 0 down).',
    datasource: {
      type: 'prometheus',
      uid: '${datasource}',
    },
    gridPos: {
      h: 8,
      w: 8,
      x: 16,
      y: 46,
    },
    targets: [
      {
        datasource: {
          type: 'prometheus',
          uid: '${datasource}',
        },
        refId: 'A',
        expr: 'hvstats_vm_source_up{job=~"$job",instance=~"$instance"}',
        legendFormat: '{{vm}} {{source}}',
      },
    ],
    fieldConfig: {
      defaults: {
        unit: 'short',
      },
      overrides: [],
    },
    options: {
      showValue: 'auto',
      mergeValues: true,
    },
  },
  {
    id: 24,
    type: 'row',
    title: 'VM: $vm',
    collapsed: false,
    gridPos: {
      h: 1,
      w: 24,
      x: 0,
      y: 54,
    },
    panels: [],
  },
  {
    id: 25,
    type: 'timeseries',
    title: 'VM intercepts by class, and all exits',
    description: "The selected VMs' intercepts by class, each a line (not stacked), and all their exits (the thick line). On VMX/SVM hosts each class is a part of the exits. Under KVM's instruction emulator (a host without VMX/SVM) KVM's exits count only the exits to the VMM and the halts: an I/O instruction, CPUID or MSR access KVM handles in the kernel (the PIT, the PIC) is counted in its class but is no exit, so there the classes can add up to more than the exits (an idle SeaBIOS VM: 55 I/O + 18 HLT a second against 58 exits). Emulated instructions are not exits: see their own panel.",
    datasource: {
      type: 'prometheus',
      uid: '${datasource}',
    },
    gridPos: {
      h: 8,
      w: 12,
      x: 0,
      y: 55,
    },
    targets: [
      {
        datasource: {
          type: 'prometheus',
          uid: '${datasource}',
        },
        refId: 'A',
        expr: 'vm_intercept:hvstats_intercepts:rate1m{job=~"$job",instance=~"$instance",vm=~"$vm"}',
        legendFormat: '{{vm}} {{intercept}}',
      },
      {
        datasource: {
          type: 'prometheus',
          uid: '${datasource}',
        },
        refId: 'B',
        expr: 'vm:hvstats_exits:rate1m{job=~"$job",instance=~"$instance",vm=~"$vm"}',
        legendFormat: '{{vm}} all exits',
      },
    ],
    fieldConfig: {
      defaults: {
        unit: 'ops',
        custom: {
          stacking: {
            mode: 'none',
            group: 'A',
          },
          fillOpacity: 0,
          lineWidth: 1,
        },
      },
      overrides: [
        {
          matcher: {
            id: 'byFrameRefID',
            options: 'B',
          },
          properties: [
            {
              id: 'custom.lineWidth',
              value: 3,
            },
          ],
        },
      ],
    },
    options: {
      legend: {
        displayMode: 'table',
        placement: 'right',
        calcs: [
          'mean',
          'max',
        ],
      },
      tooltip: {
        mode: 'multi',
        sort: 'desc',
      },
    },
  },
  {
    id: 41,
    type: 'timeseries',
    title: 'Emulated instructions per second',
    description: 'Instructions KVM emulated for the selected VMs: not exits, kept apart from the exits by reason.',
    datasource: {
      type: 'prometheus',
      uid: '${datasource}',
    },
    gridPos: {
      h: 8,
      w: 12,
      x: 12,
      y: 55,
    },
    targets: [
      {
        datasource: {
          type: 'prometheus',
          uid: '${datasource}',
        },
        refId: 'A',
        expr: 'vm:hvstats_emulated_instructions:rate1m{job=~"$job",instance=~"$instance",vm=~"$vm"}',
        legendFormat: '{{vm}}',
      },
    ],
    fieldConfig: {
      defaults: {
        unit: 'ops',
        custom: {
          stacking: {
            mode: 'none',
            group: 'A',
          },
          fillOpacity: 10,
          lineWidth: 1,
        },
      },
      overrides: [],
    },
    options: {
      legend: {
        displayMode: 'table',
        placement: 'right',
        calcs: [
          'mean',
          'max',
        ],
      },
      tooltip: {
        mode: 'multi',
        sort: 'desc',
      },
    },
  },
  {
    id: 27,
    type: 'timeseries',
    title: 'CPU wait by VP',
    description: 'Of the time each vCPU wanted a host CPU, the share it waited.',
    datasource: {
      type: 'prometheus',
      uid: '${datasource}',
    },
    gridPos: {
      h: 8,
      w: 8,
      x: 0,
      y: 63,
    },
    targets: [
      {
        datasource: {
          type: 'prometheus',
          uid: '${datasource}',
        },
        refId: 'A',
        expr: 'vp:hvstats_cpu_wait:ratio1m{job=~"$job",instance=~"$instance",vm=~"$vm"}',
        legendFormat: '{{vm}} VP {{vp}}',
      },
    ],
    fieldConfig: {
      defaults: {
        unit: 'percentunit',
        custom: {
          stacking: {
            mode: 'none',
            group: 'A',
          },
          fillOpacity: 10,
          lineWidth: 1,
        },
      },
      overrides: [],
    },
    options: {
      legend: {
        displayMode: 'table',
        placement: 'right',
        calcs: [
          'mean',
          'max',
        ],
      },
      tooltip: {
        mode: 'multi',
        sort: 'desc',
      },
    },
  },
  {
    id: 28,
    type: 'timeseries',
    title: 'Exits per second per vCPU',
    description: 'What the exit storm alert compares.',
    datasource: {
      type: 'prometheus',
      uid: '${datasource}',
    },
    gridPos: {
      h: 8,
      w: 8,
      x: 8,
      y: 63,
    },
    targets: [
      {
        datasource: {
          type: 'prometheus',
          uid: '${datasource}',
        },
        refId: 'A',
        expr: 'vm:hvstats_exits_per_vcpu:rate1m{job=~"$job",instance=~"$instance",vm=~"$vm"}',
        legendFormat: '{{vm}}',
      },
    ],
    fieldConfig: {
      defaults: {
        unit: 'ops',
        custom: {
          stacking: {
            mode: 'none',
            group: 'A',
          },
          fillOpacity: 10,
          lineWidth: 1,
        },
      },
      overrides: [],
    },
    options: {
      legend: {
        displayMode: 'table',
        placement: 'right',
        calcs: [
          'mean',
          'max',
        ],
      },
      tooltip: {
        mode: 'multi',
        sort: 'desc',
      },
    },
  },
  {
    id: 29,
    type: 'state-timeline',
    title: 'VM state',
    description: 'The state the VMM reports for each VM.',
    datasource: {
      type: 'prometheus',
      uid: '${datasource}',
    },
    gridPos: {
      h: 8,
      w: 8,
      x: 16,
      y: 63,
    },
    targets: [
      {
        datasource: {
          type: 'prometheus',
          uid: '${datasource}',
        },
        refId: 'A',
        expr: 'hvstats_vm_state{job=~"$job",instance=~"$instance",vm=~"$vm"} == 1',
        legendFormat: '{{vm}} {{state}}',
      },
    ],
    fieldConfig: {
      defaults: {
        unit: 'short',
      },
      overrides: [],
    },
    options: {
      showValue: 'auto',
      mergeValues: true,
    },
  },
  {
    id: 42,
    type: 'timeseries',
    title: 'Time halted per vCPU',
    description: "The share of the time each vCPU of the selected VMs spent halted (after a HLT, waiting or polling for a wake-up): 100 % for an idle vCPU. Time halted, not time spent handling HLTs; each vCPU's own.",
    datasource: {
      type: 'prometheus',
      uid: '${datasource}',
    },
    gridPos: {
      h: 8,
      w: 24,
      x: 0,
      y: 71,
    },
    targets: [
      {
        datasource: {
          type: 'prometheus',
          uid: '${datasource}',
        },
        refId: 'A',
        expr: 'vp:hvstats_halted:ratio1m{job=~"$job",instance=~"$instance",vm=~"$vm"}',
        legendFormat: '{{vm}} VP {{vp}}',
      },
    ],
    fieldConfig: {
      defaults: {
        unit: 'percentunit',
        custom: {
          stacking: {
            mode: 'none',
            group: 'A',
          },
          fillOpacity: 10,
          lineWidth: 1,
        },
        max: 1,
      },
      overrides: [],
    },
    options: {
      legend: {
        displayMode: 'table',
        placement: 'right',
        calcs: [
          'mean',
          'max',
        ],
      },
      tooltip: {
        mode: 'multi',
        sort: 'desc',
      },
    },
  },
  {
    id: 34,
    type: 'row',
    title: 'VP: $vp',
    collapsed: false,
    gridPos: {
      h: 1,
      w: 24,
      x: 0,
      y: 79,
    },
    panels: [],
  },
  {
    id: 35,
    type: 'timeseries',
    title: 'Exits per second by VP',
    description: 'Every exit of each selected VP.',
    datasource: {
      type: 'prometheus',
      uid: '${datasource}',
    },
    gridPos: {
      h: 8,
      w: 8,
      x: 0,
      y: 80,
    },
    targets: [
      {
        datasource: {
          type: 'prometheus',
          uid: '${datasource}',
        },
        refId: 'A',
        expr: 'rate(hvstats_vp_exits_total{job=~"$job",instance=~"$instance",vm=~"$vm",vp=~"$vp"}[$__rate_interval])',
        legendFormat: '{{vm}} VP {{vp}}',
      },
    ],
    fieldConfig: {
      defaults: {
        unit: 'ops',
        custom: {
          stacking: {
            mode: 'none',
            group: 'A',
          },
          fillOpacity: 10,
          lineWidth: 1,
        },
      },
      overrides: [],
    },
    options: {
      legend: {
        displayMode: 'table',
        placement: 'right',
        calcs: [
          'mean',
          'max',
        ],
      },
      tooltip: {
        mode: 'multi',
        sort: 'desc',
      },
    },
  },
  {
    id: 36,
    type: 'timeseries',
    title: 'Intercepts by class by VP, and all exits',
    description: "Each selected VP's intercepts by class, each a line (not stacked), and all its exits (the thick line). On VMX/SVM hosts each class is a part of the exits. Under KVM's instruction emulator (a host without VMX/SVM) KVM's exits count only the exits to the VMM and the halts: an I/O instruction, CPUID or MSR access KVM handles in the kernel (the PIT, the PIC) is counted in its class but is no exit, so there the classes can add up to more than the exits (an idle SeaBIOS VM: 55 I/O + 18 HLT a second against 58 exits). Emulated instructions are not exits: see their own panel.",
    datasource: {
      type: 'prometheus',
      uid: '${datasource}',
    },
    gridPos: {
      h: 8,
      w: 8,
      x: 8,
      y: 80,
    },
    targets: [
      {
        datasource: {
          type: 'prometheus',
          uid: '${datasource}',
        },
        refId: 'A',
        expr: 'sum by (instance, vm, vp, intercept) (rate(hvstats_vp_intercepts_total{job=~"$job",instance=~"$instance",vm=~"$vm",vp=~"$vp",intercept!="emulated"}[$__rate_interval]))',
        legendFormat: '{{vm}} VP {{vp}} {{intercept}}',
      },
      {
        datasource: {
          type: 'prometheus',
          uid: '${datasource}',
        },
        refId: 'B',
        expr: 'sum by (instance, vm, vp) (rate(hvstats_vp_exits_total{job=~"$job",instance=~"$instance",vm=~"$vm",vp=~"$vp"}[$__rate_interval]))',
        legendFormat: '{{vm}} VP {{vp}} all exits',
      },
    ],
    fieldConfig: {
      defaults: {
        unit: 'ops',
        custom: {
          stacking: {
            mode: 'none',
            group: 'A',
          },
          fillOpacity: 0,
          lineWidth: 1,
        },
      },
      overrides: [
        {
          matcher: {
            id: 'byFrameRefID',
            options: 'B',
          },
          properties: [
            {
              id: 'custom.lineWidth',
              value: 3,
            },
          ],
        },
      ],
    },
    options: {
      legend: {
        displayMode: 'table',
        placement: 'right',
        calcs: [
          'mean',
          'max',
        ],
      },
      tooltip: {
        mode: 'multi',
        sort: 'desc',
      },
    },
  },
  {
    id: 37,
    type: 'timeseries',
    title: 'CPU wait per dispatch',
    description: 'Average time a VP waited for a host CPU each time it was put on one.',
    datasource: {
      type: 'prometheus',
      uid: '${datasource}',
    },
    gridPos: {
      h: 8,
      w: 8,
      x: 16,
      y: 80,
    },
    targets: [
      {
        datasource: {
          type: 'prometheus',
          uid: '${datasource}',
        },
        refId: 'A',
        expr: 'vp:hvstats_cpu_wait_seconds_per_dispatch:mean1m{job=~"$job",instance=~"$instance",vm=~"$vm",vp=~"$vp"}',
        legendFormat: '{{vm}} VP {{vp}}',
      },
    ],
    fieldConfig: {
      defaults: {
        unit: 's',
        custom: {
          stacking: {
            mode: 'none',
            group: 'A',
          },
          fillOpacity: 10,
          lineWidth: 1,
        },
      },
      overrides: [],
    },
    options: {
      legend: {
        displayMode: 'table',
        placement: 'right',
        calcs: [
          'mean',
          'max',
        ],
      },
      tooltip: {
        mode: 'multi',
        sort: 'desc',
      },
    },
  },
  {
    id: 38,
    type: 'timeseries',
    title: 'Run time',
    description: "Share of one host CPU each VP's thread ran (guest and hypervisor).",
    datasource: {
      type: 'prometheus',
      uid: '${datasource}',
    },
    gridPos: {
      h: 8,
      w: 12,
      x: 0,
      y: 88,
    },
    targets: [
      {
        datasource: {
          type: 'prometheus',
          uid: '${datasource}',
        },
        refId: 'A',
        expr: 'rate(hvstats_vp_total_run_seconds_total{job=~"$job",instance=~"$instance",vm=~"$vm",vp=~"$vp"}[$__rate_interval])',
        legendFormat: '{{vm}} VP {{vp}}',
      },
    ],
    fieldConfig: {
      defaults: {
        unit: 'percentunit',
        custom: {
          stacking: {
            mode: 'none',
            group: 'A',
          },
          fillOpacity: 10,
          lineWidth: 1,
        },
      },
      overrides: [],
    },
    options: {
      legend: {
        displayMode: 'table',
        placement: 'right',
        calcs: [
          'mean',
          'max',
        ],
      },
      tooltip: {
        mode: 'multi',
        sort: 'desc',
      },
    },
  },
  {
    id: 39,
    type: 'timeseries',
    title: 'Host page faults',
    description: "Faults the host took on each VP's thread (major: waited for I/O).",
    datasource: {
      type: 'prometheus',
      uid: '${datasource}',
    },
    gridPos: {
      h: 8,
      w: 12,
      x: 12,
      y: 88,
    },
    targets: [
      {
        datasource: {
          type: 'prometheus',
          uid: '${datasource}',
        },
        refId: 'A',
        expr: 'rate(hvstats_vp_host_page_faults_total{job=~"$job",instance=~"$instance",vm=~"$vm",vp=~"$vp"}[$__rate_interval])',
        legendFormat: '{{vm}} VP {{vp}} all',
      },
      {
        datasource: {
          type: 'prometheus',
          uid: '${datasource}',
        },
        refId: 'B',
        expr: 'rate(hvstats_vp_host_major_page_faults_total{job=~"$job",instance=~"$instance",vm=~"$vm",vp=~"$vp"}[$__rate_interval])',
        legendFormat: '{{vm}} VP {{vp}} major',
      },
    ],
    fieldConfig: {
      defaults: {
        unit: 'ops',
        custom: {
          stacking: {
            mode: 'none',
            group: 'A',
          },
          fillOpacity: 10,
          lineWidth: 1,
        },
      },
      overrides: [],
    },
    options: {
      legend: {
        displayMode: 'table',
        placement: 'right',
        calcs: [
          'mean',
          'max',
        ],
      },
      tooltip: {
        mode: 'multi',
        sort: 'desc',
      },
    },
  },
  {
    id: 43,
    type: 'row',
    title: 'Histograms: $vm (serve --collector.histograms, or native histograms)',
    collapsed: false,
    gridPos: {
      h: 1,
      w: 24,
      x: 0,
      y: 96,
    },
    panels: [],
  },
  {
    id: 33,
    type: 'heatmap',
    title: 'Halt wait',
    description: "How long the selected VMs' halted vCPUs waited, blocked, for a wake-up (KVM's halt_wait_hist, log2 buckets). A reads classic buckets (the text formats), B native histograms (Prometheus with --enable-feature=native-histograms, over protobuf): the one the scrape does not give is empty.",
    datasource: {
      type: 'prometheus',
      uid: '${datasource}',
    },
    gridPos: {
      h: 8,
      w: 8,
      x: 0,
      y: 97,
    },
    targets: [
      {
        datasource: {
          type: 'prometheus',
          uid: '${datasource}',
        },
        refId: 'A',
        expr: 'sum by (le) (rate(hvstats_vp_halt_wait_duration_seconds_bucket{job=~"$job",instance=~"$instance",vm=~"$vm"}[$__rate_interval]))',
        legendFormat: '{{le}}',
        format: 'heatmap',
      },
      {
        datasource: {
          type: 'prometheus',
          uid: '${datasource}',
        },
        refId: 'B',
        expr: 'sum(rate(hvstats_vp_halt_wait_duration_seconds{job=~"$job",instance=~"$instance",vm=~"$vm"}[$__rate_interval]))',
        format: 'heatmap',
      },
    ],
    fieldConfig: {
      defaults: {
        unit: 's',
      },
      overrides: [],
    },
    options: {
      calculate: false,
      yAxis: {
        unit: 's',
      },
      cellGap: 1,
      color: {
        mode: 'scheme',
        scheme: 'Oranges',
        steps: 64,
      },
      tooltip: {
        show: true,
        yHistogram: true,
      },
    },
  },
  {
    id: 31,
    type: 'heatmap',
    title: 'Halt poll success',
    description: "How long the selected VMs' halted vCPUs polled before a wake-up came (KVM's halt_poll_success_hist, log2 buckets). A reads classic buckets (the text formats), B native histograms (Prometheus with --enable-feature=native-histograms, over protobuf): the one the scrape does not give is empty.",
    datasource: {
      type: 'prometheus',
      uid: '${datasource}',
    },
    gridPos: {
      h: 8,
      w: 8,
      x: 8,
      y: 97,
    },
    targets: [
      {
        datasource: {
          type: 'prometheus',
          uid: '${datasource}',
        },
        refId: 'A',
        expr: 'sum by (le) (rate(hvstats_vp_halt_poll_success_duration_seconds_bucket{job=~"$job",instance=~"$instance",vm=~"$vm"}[$__rate_interval]))',
        legendFormat: '{{le}}',
        format: 'heatmap',
      },
      {
        datasource: {
          type: 'prometheus',
          uid: '${datasource}',
        },
        refId: 'B',
        expr: 'sum(rate(hvstats_vp_halt_poll_success_duration_seconds{job=~"$job",instance=~"$instance",vm=~"$vm"}[$__rate_interval]))',
        format: 'heatmap',
      },
    ],
    fieldConfig: {
      defaults: {
        unit: 's',
      },
      overrides: [],
    },
    options: {
      calculate: false,
      yAxis: {
        unit: 's',
      },
      cellGap: 1,
      color: {
        mode: 'scheme',
        scheme: 'Oranges',
        steps: 64,
      },
      tooltip: {
        show: true,
        yHistogram: true,
      },
    },
  },
  {
    id: 32,
    type: 'heatmap',
    title: 'Halt poll fail',
    description: "How long the selected VMs' halted vCPUs polled in vain before blocking (KVM's halt_poll_fail_hist, log2 buckets). A reads classic buckets (the text formats), B native histograms (Prometheus with --enable-feature=native-histograms, over protobuf): the one the scrape does not give is empty.",
    datasource: {
      type: 'prometheus',
      uid: '${datasource}',
    },
    gridPos: {
      h: 8,
      w: 8,
      x: 16,
      y: 97,
    },
    targets: [
      {
        datasource: {
          type: 'prometheus',
          uid: '${datasource}',
        },
        refId: 'A',
        expr: 'sum by (le) (rate(hvstats_vp_halt_poll_fail_duration_seconds_bucket{job=~"$job",instance=~"$instance",vm=~"$vm"}[$__rate_interval]))',
        legendFormat: '{{le}}',
        format: 'heatmap',
      },
      {
        datasource: {
          type: 'prometheus',
          uid: '${datasource}',
        },
        refId: 'B',
        expr: 'sum(rate(hvstats_vp_halt_poll_fail_duration_seconds{job=~"$job",instance=~"$instance",vm=~"$vm"}[$__rate_interval]))',
        format: 'heatmap',
      },
    ],
    fieldConfig: {
      defaults: {
        unit: 's',
      },
      overrides: [],
    },
    options: {
      calculate: false,
      yAxis: {
        unit: 's',
      },
      cellGap: 1,
      color: {
        mode: 'scheme',
        scheme: 'Oranges',
        steps: 64,
      },
      tooltip: {
        show: true,
        yHistogram: true,
      },
    },
  },
]
