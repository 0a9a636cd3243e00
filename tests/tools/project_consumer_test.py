#!/usr/bin/env python3
"""scripts/dev/project-consumer on a fixed ep-bench e2e report gives fixed numbers.

The report (data/project_consumer_report.json) is a 12-layer file of Flash's shape: 139.7 MB read per
generated token (a tenth by its 3 hash-routed layers), decode efficiency 0.74 at 1.75 GB/s, 2.4 s of
its 3.2 s of decode with the disk busy. By hand, for DeepSeek-V4-Flash on one 12 GB/s SSD: miss
fractions 0.11497 (hash) and 0.34493 (score) of 6 x 6,750,208 B per layer; 13,369,344 B per MXFP4
expert, so (3 x 0.11497 + 40 x 0.34493) x 6 x 13,369,344 = 1,134.4 MB per token, a bound of
12e9 / 1,134.4e6 = 10.578 tok/s, 0.74 x that = 7.828; the breakdown's 0.8 s idle / 32 tokens x 43 / 12
+ 2.4 s / 32 x (1,134.4 / 139.7) x (1.75 / 12) = 0.1784 s per token = 5.605 tok/s.
"""
import json
import os
import subprocess
import sys
import tempfile

ROOT = sys.argv[1]
SCRIPT = os.path.join(ROOT, "scripts", "dev", "project-consumer")
REPORT = os.path.join(ROOT, "tests", "tools", "data", "project_consumer_report.json")

failures = []


def check(what, got, want, rel=1e-4):
    if abs(got - want) > rel * abs(want):
        failures.append(f"{what}: {got} (expected {want})")


def run(report, *extra):
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "p.json")
        r = subprocess.run([sys.executable, SCRIPT, report, "--json", out, *extra], capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"project-consumer failed: {r.stderr}")
        with open(out) as f:
            return json.load(f), r.stdout


p, text = run(REPORT)
flash, k3 = p["projections"]
check("flash bytes per token", flash["ssd_bytes_per_token"], 1134418252)
check("flash 1 SSD bound", flash["ssds"]["1"]["bound_tps"], 10.5781)
check("flash 1 SSD efficiency", flash["ssds"]["1"]["efficiency_tps"], 7.8278)
check("flash 1 SSD breakdown", flash["ssds"]["1"]["breakdown_tps"], 5.6054)
check("flash 2 SSDs bound", flash["ssds"]["2"]["bound_tps"], 21.1562)
check("flash 2 SSDs efficiency", flash["ssds"]["2"]["efficiency_tps"], 15.6556)
check("flash 2 SSDs breakdown", flash["ssds"]["2"]["breakdown_tps"], 7.4631)
check("flash cache fraction", flash["cache_fraction"], 20.0 / 147.2, rel=1e-3)
check("k3 bytes per token", k3["ssd_bytes_per_token"], 8909333592)
check("k3 1 SSD efficiency", k3["ssds"]["1"]["efficiency_tps"], 0.9967)
check("k3 2 SSDs breakdown", k3["ssds"]["2"]["breakdown_tps"], 1.8504)
# The file's budgets are Flash's fractions: K3's differ and the output says so.
if not any(a.startswith("Kimi-K3: the box's budgets") for a in p["assumptions"]):
    failures.append("no assumption names K3's budgets differing from the file's")
if any(a.startswith("DeepSeek-V4-Flash: the box's budgets") for a in p["assumptions"]):
    failures.append("Flash's budgets are the file's fractions, yet flagged")
if "assumptions:" not in text:
    failures.append("the printed output has no assumptions")

# Without the breakdown and the layer groups: projection A only, one miss fraction.
with open(REPORT) as f:
    old = json.load(f)
del old["all"]["decode_breakdown"]
del old["layer_groups"]
with tempfile.TemporaryDirectory() as d:
    path = os.path.join(d, "old.json")
    with open(path, "w") as f:
        json.dump(old, f)
    p2, _ = run(path, "--model", "flash")
(only,) = p2["projections"]
if "breakdown_tps" in only["ssds"]["1"]:
    failures.append("a breakdown projection without a breakdown")
# one fraction: 139.7e6 / (12 x 6 x 6,750,208) of 43 x 6 x 13,369,344 per token
check("flash bytes per token, one fraction", only["ssd_bytes_per_token"], 139.7e6 / (12 * 6 * 6750208) * 43 * 6 * 13369344)

# A file that is not a report fails with its name.
r = subprocess.run([sys.executable, SCRIPT, os.path.join(ROOT, "README.md")], capture_output=True, text=True)
if r.returncode == 0 or "README.md" not in r.stderr:
    failures.append(f"a non-JSON report: rc {r.returncode}, stderr {r.stderr!r}")

if failures:
    sys.exit("\n".join(failures))
print("project-consumer: all checks passed")
