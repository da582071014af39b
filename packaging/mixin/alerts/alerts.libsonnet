// Alerting rules for hvstats, over the recording rules (load both) and the exporter's own series.
// Thresholds are starting points: tune them to the fleet (a host that runs batch VMs tolerates
// more CPU wait than one that runs latency-bound ones).
//
// Every alert has unit tests in packaging/prometheus/hvstats.test.yml (`promtool test rules
// hvstats.test.yml`): one in which it fires, and one with the false alarm it must not raise (an
// idle VM, a restarted exporter or observer, a brief blip). Every join matches on the cluster
// label too, so two clusters' hosts of one name are never compared with each other.
{
  prometheusAlerts+:: {
    local c = $._config,
    local alert(name, expr, hold, severity, summary, description) = {
      alert: name,
      expr: expr,
      'for': hold,
      labels: { severity: severity },
      annotations: { summary: summary, description: description },
    },
    groups+: [
      {
        name: 'hvstats.alerts',
        rules: [
          alert(
            'HvstatsExporterDown',
            'up{%s} == 0' % c.hvstatsSelector,
            '5m',
            'critical',
            'hvstats exporter on {{ $labels.instance }} is down',
            'Prometheus has not scraped hvstats serve on {{ $labels.instance }} for 5 minutes: none of its VMs are watched. Check `systemctl status hvstats-serve` on the host.',
          ),
          alert(
            'HvstatsReadErrors',
            'hvstats_read_errors > 0',
            '10m',
            'warning',
            'hvstats on {{ $labels.instance }} cannot read {{ $value }} instances or pages',
            'For 10 minutes every scrape of {{ $labels.instance }} found instances it could not attach or pages it could not read (`curl {{ $labels.instance }}/healthz` says which).',
          ),
          // CPU wait as a share of runnable time (run + wait), the share `hvstats report` prints
          // per VP, with an activity floor: a VM whose vCPUs want less than a tenth of a host CPU
          // in all is left out, since an idle VM's few milliseconds of waiting per second make a
          // large share of its tiny runnable time and say nothing of the host.
          alert(
            'HvstatsVMCPUWaitHigh',
            |||
              vm:hvstats_cpu_wait:ratio1m > 0.1
                and on (%s, job, instance, vm) vm:hvstats_runnable_seconds:rate1m >= 0.1
            ||| % c.clusterLabel,
            '10m',
            'warning',
            'VM {{ $labels.vm }} on {{ $labels.instance }} waits for a CPU {{ $value | humanizePercentage }} of its runnable time',
            "For 10 minutes the vCPUs of {{ $labels.vm }}, wanting at least a tenth of a host CPU, spent more than 10 % of their runnable time (run + wait) waiting for a host CPU: the host is overcommitted, or other work competes with the VM's threads. `hvstats report` of a recording shows the same share per VP.",
          ),
          alert(
            'HvstatsVMExitStorm',
            'vm:hvstats_exits_per_vcpu:rate1m > 100000',
            '5m',
            'warning',
            'VM {{ $labels.vm }} on {{ $labels.instance }} exits {{ $value | humanize }} times per second per vCPU',
            "For 5 minutes each vCPU of {{ $labels.vm }} left the guest more than 100,000 times a second. The dashboard's exits by reason say which class (a guest polling a device, an MSR or timer storm, a misconfigured enlightenment).",
          ),
          alert(
            'HvstatsVMCountersStopped',
            |||
              sum by (%(l)s, job, instance, vm) (rate(hvstats_vp_total_run_seconds_total[15m])) == 0
                and on (%(l)s, job, instance, vm) hvstats_vm_state{state="running"} == 1
            ||| % { l: c.clusterLabel },
            '5m',
            'warning',
            'VM {{ $labels.vm }} on {{ $labels.instance }} is running but its counters stopped',
            'The VMM says {{ $labels.vm }} is running, yet no vCPU of it has run for 20 minutes as far as hvstats counts: its counting stopped (see hvstats_vm_source_up), or the guest is stuck with interrupts off.',
          ),
          alert(
            'HvstatsVMSourceDown',
            'hvstats_vm_source_up == 0',
            '5m',
            'warning',
            'Counter source {{ $labels.source }} of VM {{ $labels.vm }} on {{ $labels.instance }} is down',
            'For 5 minutes the observer could not read {{ $labels.source }} for {{ $labels.vm }}: the counters that source gives are not moving (the observer retries with backoff; its log says why).',
          ),
          alert(
            'HvstatsVMInternalError',
            'hvstats_vm_state{state="internal-error"} == 1',
            '1m',
            'critical',
            'VM {{ $labels.vm }} on {{ $labels.instance }} stopped on an internal error',
            "QEMU reports {{ $labels.vm }} in state internal-error: KVM could not run it further (an emulation failure or a failed entry). The VMM's log has the registers.",
          ),
          alert(
            'HvstatsObserverDown',
            'hvstats_observer_up == 0',
            '2m',
            'warning',
            'hvstats observer {{ $labels.publisher }} on {{ $labels.instance }} is down',
            "The observer that publishes the VMs of {{ $labels.instance }} is not running: their counters are gone from this host's scrape. Check `systemctl status hvstats-observe`.",
          ),
          // A host whose exporter answers but has no observer at all: never enabled, or gone for
          // good (an observer that stopped cleanly says 0, HvstatsObserverDown). The grace period
          // covers a restart of the exporter (no scrape, then the observer is back at the first)
          // and of the observer (its instance appears again within seconds).
          alert(
            'HvstatsObserverAbsent',
            'up{%s} == 1 unless on (%s, job, instance) hvstats_observer_up' % [c.hvstatsSelector, c.clusterLabel],
            '10m',
            'warning',
            'hvstats on {{ $labels.instance }} exports no observer',
            'For 10 minutes the exporter on {{ $labels.instance }} answered without any hvstats_observer_up series: no observer publishes the VMs of this host, so none of them is watched. Run `systemctl enable --now hvstats-observe` (or `serve --observe-all`), and check `journalctl -u hvstats-observe`.',
          ),
          alert(
            'HvstatsObserverStale',
            'time() - hvstats_observer_last_refresh_timestamp_seconds > 60',
            '2m',
            'warning',
            'hvstats observer {{ $labels.publisher }} on {{ $labels.instance }} last refreshed {{ $value | humanizeDuration }} ago',
            "The observer is alive but has not refreshed its VMs' counters for more than a minute: every rate of its VMs reads 0 although the guests run.",
          ),
          // The refused VMs are counted by reason (one series per row of the observer's refusal
          // table): a capability the observer lacks hides every VM of another user, and is the
          // operator's to fix; a VM over a budget, or held by another observer, is the VM's.
          alert(
            'HvstatsObserverLacksCapability',
            'hvstats_observer_vms{state="refused",reason=~"no_cap_.+"} > 0',
            '5m',
            'warning',
            '{{ $value }} VMs on {{ $labels.instance }} are hidden: the observer lacks a capability ({{ $labels.reason }})',
            'The observer {{ $labels.publisher }} runs without a capability its unit gives ({{ $labels.reason }}), so it cannot read the VMs of other users: they have no series. Restore CapabilityBoundingSet= of hvstats-observe.service (a drop-in that narrows it, or a container without it); its log names the capability once at start.',
          ),
          alert(
            'HvstatsObserverRefusedVMs',
            'hvstats_observer_vms{state="refused",reason!~"no_cap_.+"} > 0',
            '15m',
            'info',
            '{{ $value }} VMs on {{ $labels.instance }} are not observed ({{ $labels.reason }})',
            "The observer {{ $labels.publisher }} found VMs it has not attached to for 15 minutes, for the reason {{ $labels.reason }} (descriptor_budget: over the open file limit; claimed_elsewhere: another observer publishes them; qmp_socket_hidden: observed without QMP; several_vms: a process holds several KVM VMs): they have no series, or fewer. Its log says each VM's reason and fix.",
          ),
        ],
      },
    ],
  },
}
