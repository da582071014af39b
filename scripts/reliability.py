#!/usr/bin/env python3
"""Measures the reliability rows of BENCHMARKS.md on the release binary with real QEMU guests.

Every row is a bounded run on loopback of `hvstats serve --observe-all`, observing only the
guests this script starts (`--vm '^rel-'`), and reports what it counted, not a timing goal:

- churn: VM lifecycles (start QEMU, wait until its series show, let it run, stop it, wait until
  its series are gone), at most 4 at once. serve's RSS, fds, threads, arena bytes, runtime
  directory entries and bpffs entries after warm-up and at the end, how many refreshes each
  exited VM's series took to go, and serve's log lines per lifecycle.
- crash: SIGKILLs of serve at random points of its refreshes (2 VMs running), a new serve each
  time on the same address, scraped every 0.5 s throughout: counters that went back with no later
  `_created` (a reset unsaid), read errors, refreshes until the new serve showed both VMs, and
  instance files left of dead observers once a new one attached.
- disk-full: `hvstats record` into a 64 KiB tmpfs: whether every line is whole, and where `report`
  says the recording ends.
- soak: VMs under serve with a scrape every second: scrape latency p50/p99, RSS and fds at start
  and end.

Usage:

    scripts/reliability.py [--churn N] [--crash N] [--soak-seconds S] [--soak-vms N] [--only ROW]

Writes the "## Reliability" section of BENCHMARKS.md (a row measured again replaces its line)
and prints each row as JSON. Needs root (tmpfs, KVM, the observer's perf and BPF use), QEMU and
a release build (`cargo build --release -p hvstats-cli`, which it runs).
"""

import argparse
import json
import os
import random
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime, timezone

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BINARY = os.path.join(ROOT, "target", "release", "hvstats")
STARTED = []  # every child this script started, killed at exit


def spawn(args, **kw):
    p = subprocess.Popen(args, stdin=subprocess.DEVNULL, **kw)
    STARTED.append(p)
    return p


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(port, timeout=10.0):
    """`/metrics` in the OpenMetrics text (with `_created`), and how long it took; None on failure."""
    t = time.monotonic()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.sendall(
                f"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\n"
                "Accept: application/openmetrics-text;version=1.0.0\r\n\r\n".encode()
            )
            chunks = []
            while True:
                b = s.recv(65536)
                if not b:
                    break
                chunks.append(b)
    except OSError:
        return None, time.monotonic() - t
    reply = b"".join(chunks).decode("utf-8", "replace")
    head, _, body = reply.partition("\r\n\r\n")
    if " 200 " not in head.split("\r\n")[0]:
        return None, time.monotonic() - t
    return body, time.monotonic() - t


def proc_stats(pid):
    status = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            status[k] = v.strip()
    return {
        "rss_kib": int(status["VmRSS"].split()[0]),
        "fds": len(os.listdir(f"/proc/{pid}/fd")),
        "threads": int(status["Threads"]),
    }


def tree_entries(path):
    n = 0
    for _, dirs, files in os.walk(path):
        n += len(dirs) + len(files)
    return n


def arena_bytes(run):
    d = os.path.join(run, "instances")
    return sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d) if f.endswith(".arena"))


def kept_dir(run):
    """Where the observer of runtime directory `run` keeps its in-kernel counts in bpffs: `/` as
    `-`, every byte but ASCII letters, digits and `_` as `%XX` (hvstats-host's bpf::keep)."""
    name = "".join(
        "-" if b == ord("/") else chr(b) if chr(b).isascii() and (chr(b).isalnum() or b == ord("_")) else f"%{b:02X}"
        for b in os.fsencode(os.path.abspath(run))
    )
    return os.path.join("/sys/fs/bpf/hvstats", name)


def bpffs_entries(run):
    """The entries serve's observer keeps pinned in bpffs (its own directory: other processes'
    pins come and go on a shared host)."""
    try:
        return tree_entries(kept_dir(run))
    except OSError:
        return 0


class Qemu:
    """A QEMU guest under KVM (SeaBIOS, no disk) named `rel-<tag>`, with a QMP socket."""

    def __init__(self, work, tag):
        self.name = f"rel-{tag}"
        self.qmp = os.path.join(work, f"{self.name}.sock")
        self.p = spawn(
            ["qemu-system-x86_64", "-accel", "kvm", "-display", "none", "-nodefaults", "-m", "32",
             "-name", f"guest={self.name},debug-threads=on",
             "-qmp", f"unix:{self.qmp},server=on,wait=off"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )

    def stop(self):
        self.p.terminate()
        try:
            self.p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            # A host this loaded can take QEMU longer to quit: it goes all the same.
            self.p.kill()
            self.p.wait()
        try:
            os.unlink(self.qmp)
        except OSError:
            pass


class Serve:
    def __init__(self, run, port, interval, log):
        self.log = log
        self.port = port
        self.p = spawn(
            [BINARY, "serve", "--listen", f"127.0.0.1:{port}", "--observe-all", "--observe-interval",
             str(interval), "--vm", "^rel-", "--collector.created", "--runtime-dir", run],
            stdout=subprocess.DEVNULL, stderr=open(log, "a"),
        )
        deadline = time.monotonic() + 60
        while scrape(port, 2)[0] is None:
            if time.monotonic() > deadline or self.p.poll() is not None:
                sys.exit(f"serve did not start: {open(log).read()[-2000:]}")
            time.sleep(0.05)

    def kill(self, sig=signal.SIGKILL):
        self.p.send_signal(sig)
        self.p.wait(timeout=30)


def vm_shown(text, name):
    return text is not None and f'hvstats_vm_up{{vm="{name}"}} 1' in text


def vm_present(text, name):
    return text is not None and f'vm="{name}"' in text


def counter_series(text):
    """Each counter series of a scrape: its value and `_created`."""
    out = {}
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        series, _, value = line.rpartition(" ")
        name, brace, labels = series.partition("{")
        if not brace:
            continue
        for suffix, i in (("_total", 0), ("_created", 1)):
            if name.endswith(suffix):
                key = name[: -len(suffix)] + "{" + labels
                out.setdefault(key, [None, None])[i] = float(value)
    return out


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))] if xs else float("nan")


def churn(work, lifecycles, interval=1.0, at_once=4):
    run = os.path.join(work, "churn-run")
    os.makedirs(run)
    port, log = free_port(), os.path.join(work, "churn.log")
    serve = Serve(run, port, interval, log)
    lock = threading.Lock()
    state = {"next": 0, "last": 0, "gone_refreshes": [], "shown_s": [], "stuck": []}

    def snapshot():
        s = proc_stats(serve.p.pid)
        s.update(
            arena_bytes=arena_bytes(run), runtime_entries=tree_entries(run), bpffs_entries=bpffs_entries(run),
            log_lines=sum(1 for _ in open(log)),
        )
        return s

    def worker():
        while True:
            with lock:
                if state["next"] >= state["last"]:
                    return
                n = state["next"]
                state["next"] += 1
            vm = Qemu(work, f"churn-{n}")
            t = time.monotonic()
            while not vm_shown(scrape(port)[0], vm.name):
                if time.monotonic() - t > 60:
                    with lock:
                        state["stuck"].append(f"{vm.name} never shown")
                    break
                time.sleep(0.25)
            shown = time.monotonic() - t
            time.sleep(random.uniform(0.5, 2.0))
            vm.stop()
            gone_at = time.monotonic()
            while vm_present(scrape(port)[0], vm.name):
                if time.monotonic() - gone_at > 60:
                    with lock:
                        state["stuck"].append(f"{vm.name} series stayed")
                    break
                time.sleep(0.1)
            with lock:
                state["gone_refreshes"].append((time.monotonic() - gone_at) / interval)
                state["shown_s"].append(shown)

    def phase(last):
        # Lifecycles up to `last`, then 2 refreshes with no VM: both snapshots see the same.
        state["last"] = last
        threads = [threading.Thread(target=worker, daemon=True) for _ in range(at_once)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        time.sleep(2 * interval)
        return snapshot()

    t0 = time.monotonic()
    warm = phase(min(2 * at_once, lifecycles))
    end = phase(lifecycles)
    took = time.monotonic() - t0
    serve.kill(signal.SIGTERM)
    growth = {k: (end[k] - warm[k]) / warm[k] * 100 if warm.get(k) else 0.0
              for k in ("rss_kib", "fds", "threads", "arena_bytes", "runtime_entries")}
    lines_per = (end["log_lines"] - warm["log_lines"]) / max(1, lifecycles - 2 * at_once)
    gone = state["gone_refreshes"]
    flat = all(v <= 5.0 for v in growth.values())
    return {
        "name": f"churn-{lifecycles}-qemu-lifecycles-4-at-once",
        "ran": f"{lifecycles} QEMU lifecycles (≤ {at_once} at once, each 0.5–2 s after its series showed) "
               f"under serve --observe-all --observe-interval {interval:g} in {took:.0f} s; serve measured "
               f"with no VM after {2 * at_once} (warm-up) and after all",
        "after_warm_up": warm,
        "end": end,
        "growth_percent": growth,
        "series_gone_refreshes_p50": pct(gone, 0.5),
        "series_gone_refreshes_max": max(gone),
        "log_lines_per_lifecycle": lines_per,
        "stuck": state["stuck"],
        "verdict": "flat" if flat and max(gone) <= 2 and not state["stuck"] else "NOT flat",
    }


def crash(work, kills, interval=0.5):
    run = os.path.join(work, "crash-run")
    os.makedirs(run)
    port, log = free_port(), os.path.join(work, "crash.log")
    vms = [Qemu(work, f"crash-{i}") for i in range(2)]
    last, stop = {}, threading.Event()
    tally = {"scrapes": 0, "failed": 0, "unsaid": [], "said": 0, "read_errors": 0}

    def scraper():
        while not stop.is_set():
            text, _ = scrape(port, 2)
            if text is None:
                tally["failed"] += 1
            else:
                tally["scrapes"] += 1
                m = re.search(r"^hvstats_read_errors (\d+)", text, re.M)
                if m and int(m.group(1)) > 0:
                    tally["read_errors"] += 1
                for key, (value, created) in counter_series(text).items():
                    if value is None:
                        continue
                    if key in last:
                        old_value, old_created = last[key]
                        if value < old_value:
                            if created is not None and old_created is not None and created > old_created:
                                tally["said"] += 1
                            else:
                                tally["unsaid"].append(f"{key}: {old_value} -> {value}")
                    last[key] = (value, created)
            stop.wait(0.5)

    attach_refreshes, stale = [], []
    scraping = threading.Thread(target=scraper, daemon=True)
    serve = None
    for k in range(kills + 1):
        started = time.monotonic()
        serve = Serve(run, port, interval, log)
        while True:
            text, _ = scrape(port)
            if all(vm_shown(text, vm.name) for vm in vms) and 'hvstats_vp_exits_total{vm="' in text:
                break
            if time.monotonic() - started > 60:
                sys.exit(f"serve {k} never showed the VMs")
            time.sleep(0.02)
        attach_refreshes.append((time.monotonic() - started) / interval)
        arenas = [f for f in os.listdir(os.path.join(run, "instances")) if f.endswith(".arena")]
        stale.append(len(arenas) - 1)
        if k == 0:
            scraping.start()
        if k == kills:
            break
        time.sleep(random.uniform(0.0, 4 * interval))
        serve.kill()
    stop.set()
    scraping.join()
    serve.kill(signal.SIGTERM)
    for vm in vms:
        vm.stop()
    return {
        "name": f"crash-{kills}-sigkills-of-serve-observe-all",
        "ran": f"{kills} SIGKILLs of serve --observe-all --observe-interval {interval:g} at a random point "
               f"0–{4 * interval:g} s after it showed 2 QEMU guests, a new serve on the same address "
               f"each time; scraped every 0.5 s throughout",
        "scrapes": tally["scrapes"],
        "scrapes_failed_while_down": tally["failed"],
        "counters_back_with_reset_said": tally["said"],
        "counters_back_unsaid": len(tally["unsaid"]),
        "unsaid_examples": tally["unsaid"][:5],
        "scrapes_with_read_errors": tally["read_errors"],
        "attach_refreshes_p50": pct(attach_refreshes[1:], 0.5),
        "attach_refreshes_max": max(attach_refreshes[1:]),
        "attach_seconds_max": max(attach_refreshes[1:]) * interval,
        "stale_instances_after_attach_max": max(stale),
    }


def crash_verdict(r):
    missed = [
        what
        for what, bad in (
            ("a counter went back unsaid", r["counters_back_unsaid"] > 0),
            ("read errors", r["scrapes_with_read_errors"] > 0),
            ("a dead observer's instance stayed", r["stale_instances_after_attach_max"] > 0),
            (f"attached after {r['attach_refreshes_max']:.2f} refreshes (from serve's spawn), > 2",
             r["attach_refreshes_max"] > 2),
        )
        if bad
    ]
    return "ok" if not missed else "missed: " + "; ".join(missed)


def disk_full(work):
    run, disk = os.path.join(work, "disk-run"), os.path.join(work, "disk")
    os.makedirs(run)
    os.makedirs(disk)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k,mode=0700", "tmpfs", disk], check=True)
    try:
        vm = Qemu(work, "disk")
        port, log = free_port(), os.path.join(work, "disk.log")
        serve = Serve(run, port, 0.2, log)
        while not vm_shown(scrape(port)[0], vm.name):
            time.sleep(0.2)
        out = os.path.join(disk, "rec.ndjson")
        rec = subprocess.run([BINARY, "record", "-q", "--interval", "0.2", "--duration", "600",
                              "--runtime-dir", run, "-o", out], capture_output=True, text=True)
        data = open(out, "rb").read()
        lines = data.split(b"\n")
        whole = data.endswith(b"\n") and all(json.loads(l) is not None for l in lines[:-1])
        report = json.loads(subprocess.run([BINARY, "report", "--json", out], capture_output=True,
                                           text=True, check=True).stdout)
        # The same file cut in the middle of its last line, as a writer killed mid-write leaves it.
        cut = os.path.join(work, "cut.ndjson")
        with open(cut, "wb") as f:
            f.write(data[: len(data) - 100])
        cut_report = subprocess.run([BINARY, "report", cut], capture_output=True, text=True, check=True).stdout
        serve.kill(signal.SIGTERM)
        vm.stop()
    finally:
        subprocess.run(["umount", disk])
    return {
        "name": "disk-full-record-into-64-kib-tmpfs",
        "ran": "hvstats record --interval 0.2 of one QEMU guest into a 64 KiB tmpfs until it is full",
        "record_exit": rec.returncode,
        "record_said": (rec.stderr.strip().splitlines() or [""])[-1].replace(disk, "<64 KiB tmpfs>"),
        "bytes": len(data),
        "samples_kept": len(lines) - 2,
        "every_line_whole": whole,
        "report_samples": report["samples"],
        "report_ended": report["ended"],
        "report_of_a_cut_line": next((l for l in cut_report.splitlines() if "cut short" in l), ""),
        "verdict": "ok" if whole and report["samples"] == len(lines) - 2 and "cut short" in cut_report else "NOT ok",
    }


def soak(work, seconds, vms_n):
    run = os.path.join(work, "soak-run")
    os.makedirs(run)
    vms = [Qemu(work, f"soak-{i}") for i in range(vms_n)]
    port, log = free_port(), os.path.join(work, "soak.log")
    serve = Serve(run, port, 1.0, log)
    deadline = time.monotonic() + 120
    while not all(vm_shown(scrape(port)[0], vm.name) for vm in vms):
        if time.monotonic() > deadline:
            sys.exit("soak: the VMs never showed")
        time.sleep(0.5)
    start = proc_stats(serve.p.pid)
    latencies, failed = [], 0
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        text, took = scrape(port)
        if text is None:
            failed += 1
        else:
            latencies.append(took * 1000)
        time.sleep(max(0.0, 1.0 - took))
    end = proc_stats(serve.p.pid)
    serve.kill(signal.SIGTERM)
    for vm in vms:
        vm.stop()
    return {
        "name": f"soak-{seconds // 60}-min-{vms_n}-vms-1s-scrapes",
        "ran": f"{seconds} s of serve --observe-all --observe-interval 1 over {vms_n} QEMU guests, "
               f"one scrape a second ({len(latencies)} scrapes)",
        "scrape_ms_p50": pct(latencies, 0.5),
        "scrape_ms_p99": pct(latencies, 0.99),
        "scrapes_failed": failed,
        "start": start,
        "end": end,
        "verdict": "ok" if failed == 0 else "NOT ok",
    }


def row_line(r):
    name = r["name"]
    if name.startswith("churn"):
        w, e, g = r["after_warm_up"], r["end"], r["growth_percent"]
        numbers = (
            f"RSS {w['rss_kib']:,} → {e['rss_kib']:,} KiB ({g['rss_kib']:+.1f} %), fds {w['fds']} → {e['fds']}, "
            f"threads {w['threads']} → {e['threads']}, arena {w['arena_bytes']:,} → {e['arena_bytes']:,} B, "
            f"runtime-dir entries {w['runtime_entries']} → {e['runtime_entries']}, bpffs entries "
            f"{w['bpffs_entries']} → {e['bpffs_entries']}; an exited VM's series gone after "
            f"{r['series_gone_refreshes_p50']:.2f} refreshes (p50), {r['series_gone_refreshes_max']:.2f} (max); "
            f"{r['log_lines_per_lifecycle']:.1f} log lines per lifecycle"
        )
    elif name.startswith("crash"):
        numbers = (
            f"{r['scrapes']:,} scrapes ({r['scrapes_failed_while_down']} failed while no serve listened); "
            f"counters gone back: {r['counters_back_with_reset_said']:,} with a later `_created`, "
            f"{r['counters_back_unsaid']} without; scrapes with read errors {r['scrapes_with_read_errors']}; "
            f"new serve showed both VMs after {r['attach_refreshes_p50']:.2f} refreshes (p50), "
            f"{r['attach_refreshes_max']:.2f} (max, {r['attach_seconds_max']:.2f} s); dead observers' "
            f"instances left once a new one attached: {r['stale_instances_after_attach_max']}"
        )
    elif name.startswith("disk"):
        numbers = (
            f"record exit {r['record_exit']} ({r['record_said']}); {r['bytes']:,} bytes, "
            f"{r['samples_kept']} samples, every line whole: {'yes' if r['every_line_whole'] else 'NO'}; "
            f"report reads {r['report_samples']} samples, last at t = "
            f"{r['report_ended']['last_sample_seconds']:.2f} s; of the file cut 100 bytes short: "
            f"\"{r['report_of_a_cut_line']}\""
        )
    else:
        s, e = r["start"], r["end"]
        numbers = (
            f"scrape {r['scrape_ms_p50']:.1f} ms p50, {r['scrape_ms_p99']:.1f} ms p99, "
            f"{r['scrapes_failed']} failed; RSS {s['rss_kib']:,} → {e['rss_kib']:,} KiB, fds {s['fds']} → "
            f"{e['fds']}, threads {s['threads']} → {e['threads']}"
        )
    return f"| `{name}` | {r['ran']} | {numbers} | {r['verdict']} |"


HEAD = "## Reliability"
TABLE_HEAD = "| row | what ran | numbers | verdict |"
TABLE_RULE = "|---|---|---|---|"


def write_section(rows, command, started, loads):
    path = os.path.join(ROOT, "BENCHMARKS.md")
    text = open(path).read()
    before, _, old = text.partition("\n" + HEAD + "\n")
    old_rows = [l for l in old.splitlines() if l.startswith("| `")]
    old_notes = [l for l in old.splitlines() if l.startswith("`") and ": from " in l]
    kinds = ["churn", "crash", "disk", "soak"]
    kind = lambda name: kinds.index(name.split("-")[0])
    # A row measured now replaces the row of its kind (whatever size it ran at).
    new = {kind(r["name"]): row_line(r) for r in rows}
    kept = {kind(l.split("`")[1]): l for l in old_rows}
    kept.update(new)
    kept = [kept[k] for k in sorted(kept)]
    shown = {l.split("`")[1] for l in kept}
    names = ", ".join(f"`{r['name']}`" for r in rows)
    # A note dates the rows it names that are still there.
    notes = []
    for n in old_notes:
        head, _, rest = n.partition(": from ")
        still = [x for x in head.split("`")[1::2] if x in shown and x not in {r["name"] for r in rows}]
        if still:
            notes.append(", ".join(f"`{x}`" for x in still) + ": from " + rest)
    notes.append(f"{names}: from `{command}` on {started} ({loads}).")
    section = [
        HEAD,
        "",
        "Generated by `scripts/reliability.py`. Not side-by-side ratios: each row is a bounded run on",
        "loopback of the release binary, `hvstats serve --observe-all` observing only QEMU 7.2 guests the",
        "script starts (SeaBIOS, no disk, software KVM), and says what it counted. A refresh is serve's",
        "`--observe-interval`. Each row's name says its size; a fleet's are 1,000 lifecycles, 100 kills",
        "and 30 minutes of 16 VMs (`--churn 1000 --crash 100 --soak-seconds 1800 --soak-vms 16`), run",
        "on this 2-CPU host while other builds and test suites shared it (the load averages below).",
        "",
        TABLE_HEAD,
        TABLE_RULE,
        *kept,
        "",
        *[n for note in notes for n in (note, "")],
    ]
    with open(path, "w") as f:
        f.write(before.rstrip("\n") + "\n\n" + "\n".join(section).rstrip("\n") + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--churn", type=int, default=100)
    ap.add_argument("--crash", type=int, default=30)
    ap.add_argument("--soak-seconds", type=int, default=300)
    ap.add_argument("--soak-vms", type=int, default=4)
    ap.add_argument("--only", action="append", choices=["churn", "crash", "disk-full", "soak"])
    args = ap.parse_args()
    subprocess.run(["cargo", "build", "--release", "-q", "-p", "hvstats-cli"], cwd=ROOT, check=True)
    only = args.only or ["churn", "crash", "disk-full", "soak"]
    command = "scripts/reliability.py " + " ".join(sys.argv[1:])
    started = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    load_before = " ".join(f"{x:.2f}" for x in os.getloadavg())
    work = tempfile.mkdtemp(prefix="hvstats-reliability-")
    rows = []
    try:
        if "churn" in only:
            rows.append(churn(work, args.churn))
        if "crash" in only:
            rows.append(crash(work, args.crash))
            rows[-1]["verdict"] = crash_verdict(rows[-1])
        if "disk-full" in only:
            rows.append(disk_full(work))
        if "soak" in only:
            rows.append(soak(work, args.soak_seconds, args.soak_vms))
    finally:
        for p in STARTED:
            if p.poll() is None:
                p.kill()
                p.wait()
        shutil.rmtree(work, ignore_errors=True)
    for r in rows:
        print(json.dumps(r))
    load_after = " ".join(f"{x:.2f}" for x in os.getloadavg())
    write_section(rows, command.strip(), started, f"load average at start {load_before}, at end {load_after}")


if __name__ == "__main__":
    main()
