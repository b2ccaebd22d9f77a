#!/usr/bin/env python3
"""Turns bench/compare.sh's JSON lines into bench/results/compare.md and one
SVG bar chart per workload (no plotting library needed).

    python3 bench/report.py RESULTS.jsonl OUT_PREFIX "COMMAND"

Labels are "workload|server". A label that ran several times (compare.sh
--repeat) is shown by its median run (by the workload's headline figure),
with the spread of that figure over the runs. Ratios are percore's S3
endpoint (and its native protocol) over each peer, medians of the same
invocation."""
import html, json, os, platform, subprocess, sys, time
from collections import OrderedDict

jsonl, prefix, command = sys.argv[1], sys.argv[2], sys.argv[3]
rows = [json.loads(l) for l in open(jsonl) if l.strip()]
runs = OrderedDict()  # (workload, server) -> every run of it
for r in rows:
    w, _, server = r["label"].partition("|")
    runs.setdefault((w, server), []).append(r)

def sh(cmd):
    try:
        return subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=10).stdout.strip()
    except Exception:
        return "?"

peers = os.environ.get("PEERS", "/opt/percore-peers")
cpu_model = sh("grep -m1 'model name' /proc/cpuinfo | cut -d: -f2")
mem_gib = sh("free -g | awk '/Mem:/ {print $2}'")
data_fs = sh("df -T /var/tmp | tail -1 | awk '{print $2 \" on \" $1}'")
machine = [
    f"CPU: {cpu_model} ({os.cpu_count()} CPUs)",
    f"memory: {mem_gib} GiB; kernel {platform.release()}",
    f"file system under the data: {data_fs}",
    f"peers: {sh('nginx -v 2>&1')}; {sh(peers + '/bin/garage --version 2>/dev/null | head -1')}; "
    f"s3s-fs {os.environ.get('S3SFS_VERSION', '0.14.1')}; {sh('fio --version')}; {sh('iperf3 --version | head -1')}",
    # compare.sh passes the revision it built; a later re-render keeps it.
    f"percore: {os.environ.get('PERCORE_REV') or sh('git rev-parse --short HEAD')}",
]

# What each workload's unit is and which figure the chart shows.
def unit_of(w):
    if w.startswith("range"):
        return "4 KiB ranges/s", "units_per_sec"
    if w.startswith("list") or w.startswith("scale-list"):
        return "keys listed/s", "units_per_sec"
    if w.startswith("mixed"):
        return "ops/s", "ops_per_sec"
    if w.startswith("scale-batch"):
        return "samples/s", "units_per_sec"
    return "MB/s", "mb_per_sec"

def median_run(w, rs):
    """The run whose headline figure is the median (lower middle for an
    even count), with that figure's (min, max) over the runs."""
    _, key = unit_of(w)
    rs = sorted(rs, key=lambda r: r.get(key) or 0)
    vals = [r.get(key) or 0 for r in rs]
    m = dict(rs[(len(rs) - 1) // 2])
    m["runs"], m["spread"] = len(rs), (vals[0], vals[-1])
    return m

groups = OrderedDict()
for (w, server), rs in runs.items():
    groups.setdefault(w, []).append((server, median_run(w, rs) if w != "ceiling" else rs[0]))

def fmt(v, d=0):
    return "-" if v is None else f"{v:,.{d}f}"

def svg(w, items, unit, path):
    width, bar_h, left = 640, 22, 170
    height = 40 + bar_h * len(items) + 20
    top = max([v for _, v in items] + [1e-9])
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="12">',
           f'<text x="8" y="18" font-size="14" font-weight="bold">{html.escape(w)} ({html.escape(unit)}, higher is better)</text>']
    for i, (name, v) in enumerate(items):
        y = 32 + i * bar_h
        bw = (width - left - 90) * v / top
        color = "#d9534f" if name.startswith("percore") else "#5b8db8"
        out.append(f'<text x="{left - 6}" y="{y + 15}" text-anchor="end">{html.escape(name)}</text>')
        out.append(f'<rect x="{left}" y="{y + 3}" width="{bw:.1f}" height="{bar_h - 6}" fill="{color}"/>')
        out.append(f'<text x="{left + bw + 4:.1f}" y="{y + 15}">{v:,.1f}</text>')
    out.append("</svg>")
    open(path, "w").write("\n".join(out) + "\n")

md = [f"# percore vs peers ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})", "",
      f"Command: `{command}`", ""]
md += [f"- {m}" for m in machine]
md += ["", "Server alone on one CPU, load generator (`percore bench`, 1 thread, 16 connections) on "
       "another, loopback. Each row is the median of its runs (the runs column gives their number and "
       "the spread of the headline figure); ratios divide medians. Server CPU is user+system time of "
       "the server's processes from /proc "
       "during the measured window. On loopback the kernel copies every send: no row here measures "
       "zero-copy or NIC queues.", ""]

ceil = groups.pop("ceiling", [])
if ceil:
    md += ["## Ceilings", "", "| what | MB/s | ops/s | p50 ms | p99 ms |", "|---|---|---|---|---|"]
    for name, r in ceil:
        lat = r.get("latency_ms", {})
        md.append(f"| {name} | {fmt(r.get('mb_per_sec'), 1)} | {fmt(r.get('ops_per_sec'))} | "
                  f"{fmt(lat.get('p50'), 3) if lat else '-'} | {fmt(lat.get('p99'), 3) if lat else '-'} |")
    md.append("")

for w, items in groups.items():
    unit, key = unit_of(w)
    scale = w.startswith("scale-")
    md += [f"## {w}", ""]
    if not scale:
        md.append(f"![{w}]({os.path.basename(prefix)}-{w}.svg)")
        md.append("")
    md += [f"| server | {unit} (median) | runs: min-max | ops/s | MB/s | p50 ms | p99 ms | p99.9 ms | "
           "TTFB p50 ms | errors | server CPU µs/unit | server CPU-s/GB | percore-s3 ÷ this | "
           "percore-native ÷ this |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    by = dict(items)
    for name, r in items:
        lat, tt = r.get("latency_ms", {}), r.get("ttfb_ms", {})
        ratios = []
        for mine in ("percore-s3", "percore-native"):
            m = by.get(mine)
            ratios.append(f"{m[key] / r[key]:.2f}x" if m and r.get(key) and name != mine else "-")
        lo, hi = r["spread"]
        md.append(f"| {name} | {fmt(r.get(key), 1)} | {r['runs']}: {fmt(lo, 1)}-{fmt(hi, 1)} | "
                  f"{fmt(r.get('ops_per_sec'))} | {fmt(r.get('mb_per_sec'), 1)} | "
                  f"{fmt(lat.get('p50'), 3)} | {fmt(lat.get('p99'), 3)} | {fmt(lat.get('p999'), 3)} | "
                  f"{fmt(tt.get('p50'), 3)} | {r.get('errors', 0)} | {fmt(r.get('server_cpu_us_per_unit'), 1)} | "
                  f"{fmt(r.get('server_cpu_seconds_per_gb'), 2)} | {ratios[0]} | {ratios[1]} |")
        if r.get("errors"):
            md.append(f"|  | first error: {html.escape(r.get('first_error', ''))[:120]} ||||||||||||")
    md.append("")
    if not scale:
        svg(w, [(n, r.get(key) or 0) for n, r in items], unit, f"{prefix}-{w}.svg")

md += ["## Notes", "",
       "- percore reads segments with O_DIRECT (no page cache) and keeps hot objects in its own "
       "per-shard object cache; nginx, Garage and s3s-fs read through the page cache. The cold rows "
       "drop the page cache (`echo 3 > /proc/sys/vm/drop_caches`) and percore's object cache "
       "(`POST /cache/drop` on its admin port) first, then read every object once.",
       "- put-1M: percore and Garage acknowledge after fsync (Garage: data_fsync and metadata_fsync on); "
       "s3s-fs does not fsync, so its PUT rows are not durable and not comparable as such.",
       "- Garage 2.5.0 and s3s-fs 0.14.1 do not set TCP_NODELAY on accepted connections (strace shows no "
       "such setsockopt): a response written in two pieces waits for the client's delayed ACK, hence "
       "their ~44 ms latencies at small sizes. Measured as shipped; the load generator sets TCP_NODELAY "
       "on its own side.",
       "- The 2-CPU machine gives the server one CPU: these are per-core figures. The shard-scaling rows "
       "run all shards on that one CPU (overhead of sharding, not scaling) and, as on a real machine, "
       "16 connections per shard, so 2 and 4 shards also get 2x and 4x the queue depth; one run each. "
       "bench/scale.sh with disjoint CPU lists measures scaling on a larger machine.", ""]
open(prefix + ".md", "w").write("\n".join(md))
print("\n".join(md))
