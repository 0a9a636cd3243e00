#!/usr/bin/env python3
"""Checks scripts/gemv-timeline-summary on synthetic block records with known timings: the launch
period, the wait, x, first-chunk and row phases it prints, and its errors for a cut or empty file."""
import os
import struct
import subprocess
import sys
import tempfile

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts", "gemv-timeline-summary")


def write_records(path, launches, blocks_x, blocks_y, period_ns):
    """Launch L (base 1e6 + L·period_ns ns), block b: start 300 ns before the base + 100·b, wait
    returned 2000 ns after the base, x 1500 ns later, first chunks 500 ns after x, first warp done
    5000 + 10·b ns after them, last warp 200 ns after that, on SM b."""
    with open(path, "wb") as f:
        blocks = blocks_x * blocks_y
        for L in range(launches):
            base = 1_000_000 + L * period_ns
            for b in range(blocks):
                start = base - 300 + 100 * b
                wait = base + 2000
                x = wait + 1500
                chunk = x + 500
                first = chunk + 5000 + 10 * b
                last = first + 200
                f.write(struct.pack("<8Q", start, wait, x, chunk, first, last, b, ((b // blocks_x) << 32) | (b % blocks_x)))
    # the last block of launch L ends at its base + 9200 + 10·(blocks − 1): period_ns apart


def run(path):
    return subprocess.run([sys.executable, SCRIPT, path], capture_output=True, text=True)


def value(out, label):
    for line in out.splitlines():
        if line.strip().startswith(label):
            return [float(t) for t in line.split()[-3:] if t.replace(".", "", 1).replace("-", "", 1).isdigit()]
    raise AssertionError(f"no line '{label}' in:\n{out}")


def main():
    failures = 0

    def check(cond, what):
        nonlocal failures
        if not cond:
            failures += 1
            print("FAILED:", what)

    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "t.bin")
        write_records(path, launches=8, blocks_x=3, blocks_y=2, period_ns=12000)
        r = run(path)
        check(r.returncode == 0, f"exit 0 (got {r.returncode}: {r.stderr})")
        out = r.stdout
        check("48 block records, 6 blocks per launch on 6 SMs, 8 launches" in out, "record count line:\n" + out)
        check(abs(value(out, "launch period")[-1] - 12.0) < 1e-9, "period 12.00 us")
        # the previous launch's last block ended 12000 − 9250 = 2750 ns before this launch's base
        check(value(out, "wait returned") == [4.75, 4.75, 4.75], "wait returned 4.75 (all blocks)")
        check(value(out, "block start") == [2.45, 2.7, 2.95], "block start 2.45 / 2.70 / 2.95")
        check(value(out, "x quantized")[-2:] == [1.5, 1.5], "x 1.50 / 1.50")
        check(value(out, "first chunks landed")[-2:] == [0.5, 0.5], "first chunks 0.50 / 0.50")
        comp = value(out, "rows computed")[-2:]
        # 5200 + 10·b + 50 ns for b = 0..5: median 5.225 (printed to 0.01), max 5.25
        check(abs(comp[0] - 5.225) < 0.006 and abs(comp[1] - 5.25) < 1e-9, f"rows computed 5.22 / 5.25 (got {comp})")
        check(abs(value(out, "previous launch: first to last")[-1] - 0.05) < 1e-9, "end spread 0.05")

        cut = os.path.join(d, "cut.bin")
        with open(path, "rb") as f, open(cut, "wb") as g:
            g.write(f.read()[:100])
        r = run(cut)
        check(r.returncode != 0 and "cut at offset 64" in r.stderr, f"a cut file is refused with its offset ({r.stderr})")
        empty = os.path.join(d, "empty.bin")
        open(empty, "wb").close()
        r = run(empty)
        check(r.returncode != 0 and "no records" in r.stderr, f"an empty file is refused ({r.stderr})")
    if failures:
        sys.exit(f"{failures} check(s) failed")
    print("gemv-timeline-summary: all checks passed")


if __name__ == "__main__":
    main()
