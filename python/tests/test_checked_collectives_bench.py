"""python/bench/checked_collectives.py, the figures of docs/distributed.md's "What it costs now", in a few calls
and steps: its one-job table at 2 processes prints every row for plain Gloo and both wrappers, and the CPU its
wrappers' own threads take (the exchange wrapper's worker does every exchange, so its share is not nil)."""
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "bench", "checked_collectives.py")


def test_the_one_job_table_prints_every_row_with_the_cpu_of_the_wrappers_threads():
    done = subprocess.run([sys.executable, SCRIPT, "--ranks", "2", "--interleaved-only", "--repeats", "1",
                           "--calls", "20", "--steps", "2", "--batch", "2"],
                          capture_output=True, text=True, timeout=170)
    assert done.returncode == 0, done.stderr
    rows = {}
    for line in done.stdout.splitlines():
        label, _, cells = line.partition("  ")
        if label.startswith(("all_reduce", "DDP")):
            rows[label] = cells.split()
    for row in ("all_reduce 4 B", "DDP step, 1 MB buckets"):
        for suffix in ("", ", CPU of all ranks", ", of it the callers' threads"):
            none, lockstep, _, exchange, _ = rows[row + suffix]
            assert float(none) > 0 and float(lockstep) > 0 and float(exchange) > 0, (row + suffix, done.stdout)
        none, lockstep, exchange = rows[row + ", of it the wrapper's threads"]
        assert none == "-" and float(lockstep) >= 0, done.stdout
    assert float(rows["all_reduce 4 B, of it the wrapper's threads"][2]) > 0, done.stdout
