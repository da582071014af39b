// Recording rules for hvstats: what a VM and a host do, aggregated once per evaluation, so the
// dashboard and the alerts read a few short series instead of every VP's.
//
// Names follow Prometheus' level:metric:operations convention. Every rule keeps the cluster label
// (_config.clusterLabel, set by Prometheus' external labels, never by hvstats), `job` and
// `instance` (the host, as Prometheus names the scrape target); per-VM rules add `vm`, per-VP
// rules `vm` and `vp`, per-class rules `intercept`. The window is _config.rateInterval (1m: at
// least four scrapes at the README's 15 s scrape interval; Prometheus' default of 1m leaves every
// rule empty).
//
// Only the exporter's default series are read (no histogram buckets): the rules and alerts work
// whatever collectors a host enables.
{
  prometheusRules+:: {
    local c = $._config,
    // `sum by` the cluster label and `labels`.
    local sumBy(labels, expr) = 'sum by (%s, %s) (%s)' % [c.clusterLabel, labels, expr],
    local rate(selector) = 'rate(%s[%s])' % [selector, c.rateInterval],
    groups+: [
      {
        name: 'hvstats.vm',
        rules: [
          // Exits of every reason, per second (KVM's `exits` vCPU statistic; absent where no
          // source gives it, never 0).
          {
            record: 'vm:hvstats_exits:rate1m',
            expr: sumBy('job, instance, vm', rate('hvstats_vp_exits_total')),
          },
          // Intercepts by class of the WHv Intercepts set, per second: only the classes that are
          // exits on VMX/SVM hosts, where they are parts of vm:hvstats_exits:rate1m. Under KVM's
          // instruction emulator (no VMX/SVM) KVM's exits count only the exits to the VMM and the
          // halts, while an I/O instruction, CPUID or MSR access handled in the kernel still
          // counts in its class: there the classes can add up to more than the exits, so the
          // dashboard draws them beside the exits, never stacked. Emulated instructions are not
          // exits (KVM emulates several per exit, or none): they have a rule of their own.
          {
            record: 'vm_intercept:hvstats_intercepts:rate1m',
            expr: sumBy('job, instance, vm, intercept', rate('hvstats_vp_intercepts_total{intercept!="emulated"}')),
          },
          {
            record: 'vm:hvstats_emulated_instructions:rate1m',
            expr: sumBy('job, instance, vm', rate('hvstats_vp_intercepts_total{intercept="emulated"}')),
          },
          // The seconds per second spent handling the exits of each class (classes whose time
          // nobody records have no time series). HLT's time is the time the vCPU spent halted,
          // not handling time: it is left out here and is vp:hvstats_halted:ratio1m.
          {
            record: 'vm_intercept:hvstats_intercept_seconds:rate1m',
            expr: sumBy('job, instance, vm, intercept', rate('hvstats_vp_intercept_seconds_total{intercept!="hlt"}')),
          },
          // Average handling time of one intercept of a class, in seconds.
          {
            record: 'vm_intercept:hvstats_intercept_seconds:mean1m',
            expr: |||
              vm_intercept:hvstats_intercept_seconds:rate1m
                / vm_intercept:hvstats_intercepts:rate1m > 0
            |||,
          },
          // Hypercalls per second.
          {
            record: 'vm:hvstats_hypercalls:rate1m',
            expr: sumBy('job, instance, vm', rate('hvstats_vp_hypercalls_total')),
          },
          // Run time: CPU seconds per second the VM's vCPU threads ran (guest and hypervisor),
          // i.e. host CPUs busy running the VM.
          {
            record: 'vm:hvstats_run_seconds:rate1m',
            expr: sumBy('job, instance, vm', rate('hvstats_vp_total_run_seconds_total')),
          },
          // Wait time: seconds per second the VM's vCPUs were ready to run but waited for a host
          // CPU.
          {
            record: 'vm:hvstats_cpu_wait_seconds:rate1m',
            expr: sumBy('job, instance, vm', rate('hvstats_vp_cpu_wait_seconds_total')),
          },
          // Runnable time: seconds per second the VM's vCPUs wanted a host CPU (ran, or waited
          // for one), i.e. the host CPUs the VM asked for. The CPU-wait alert's activity floor.
          {
            record: 'vm:hvstats_runnable_seconds:rate1m',
            expr: 'vm:hvstats_run_seconds:rate1m + vm:hvstats_cpu_wait_seconds:rate1m',
          },
          // CPU-wait ratio: of the VM's runnable time (run + wait), the share its vCPUs waited
          // for a host CPU (0 when they wanted none). `hvstats report` prints the same share per
          // VP ("% of runnable time").
          {
            record: 'vm:hvstats_cpu_wait:ratio1m',
            expr: |||
              vm:hvstats_cpu_wait_seconds:rate1m
                / clamp_min(vm:hvstats_runnable_seconds:rate1m, 1e-9)
            |||,
          },
          // The VM's vCPUs (its partition page's count), and its exits per vCPU (what the exit
          // storm alert compares).
          {
            record: 'vm:hvstats_vcpus:max',
            expr: 'max by (%s, job, instance, vm) (hvstats_partition_virtual_processors)' % c.clusterLabel,
          },
          {
            record: 'vm:hvstats_exits_per_vcpu:rate1m',
            expr: 'vm:hvstats_exits:rate1m / on (%s, job, instance, vm) clamp_min(vm:hvstats_vcpus:max, 1)' % c.clusterLabel,
          },
        ],
      },
      {
        name: 'hvstats.vp',
        rules: [
          // Per VP, for the drill-down: the same ratio as the VM's.
          {
            record: 'vp:hvstats_cpu_wait:ratio1m',
            expr: |||
              %(wait)s
                / clamp_min(%(wait)s + %(run)s, 1e-9)
            ||| % {
              wait: rate('hvstats_vp_cpu_wait_seconds_total'),
              run: rate('hvstats_vp_total_run_seconds_total'),
            },
          },
          // Time halted: the share of the time each vCPU spent halted (after a HLT, waiting or
          // polling for a wake-up: KVM's halt_wait_ns and halt poll times), 1 for a vCPU halted
          // throughout. Per vCPU: one vCPU's halted time is never added to another's.
          {
            record: 'vp:hvstats_halted:ratio1m',
            expr: 'sum without (intercept) (%s)\n' % rate('hvstats_vp_intercept_seconds_total{intercept="hlt"}'),
          },
          // Average wait for a host CPU per dispatch, in seconds.
          {
            record: 'vp:hvstats_cpu_wait_seconds_per_dispatch:mean1m',
            expr: |||
              %s
                / %s > 0
            ||| % [rate('hvstats_vp_cpu_wait_seconds_total'), rate('hvstats_vp_dispatches_total')],
          },
        ],
      },
      {
        name: 'hvstats.host',
        rules: [
          { record: 'instance:hvstats_exits:rate1m', expr: sumBy('job, instance', 'vm:hvstats_exits:rate1m') },
          {
            record: 'instance_intercept:hvstats_intercepts:rate1m',
            expr: sumBy('job, instance, intercept', 'vm_intercept:hvstats_intercepts:rate1m'),
          },
          { record: 'instance:hvstats_hypercalls:rate1m', expr: sumBy('job, instance', 'vm:hvstats_hypercalls:rate1m') },
          { record: 'instance:hvstats_run_seconds:rate1m', expr: sumBy('job, instance', 'vm:hvstats_run_seconds:rate1m') },
          {
            record: 'instance:hvstats_cpu_wait_seconds:rate1m',
            expr: sumBy('job, instance', 'vm:hvstats_cpu_wait_seconds:rate1m'),
          },
          {
            record: 'instance:hvstats_cpu_wait:ratio1m',
            expr: |||
              instance:hvstats_cpu_wait_seconds:rate1m
                / clamp_min(instance:hvstats_cpu_wait_seconds:rate1m + instance:hvstats_run_seconds:rate1m, 1e-9)
            |||,
          },
          // VMs whose counters the last scrape read.
          {
            record: 'instance:hvstats_vms_up:count',
            expr: 'count by (%s, job, instance) (hvstats_vm_up == 1)' % c.clusterLabel,
          },
        ],
      },
    ],
  },
}
