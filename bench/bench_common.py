"""What the Python benchmarks and reference scripts share: timing a step as vitlens' bench does
(median of runs within a time budget) and reading the bytes of an IDX file (Fashion-MNIST) as
core/data/idx_reader.cpp does (plain or gzip'd, the .gz tried when the plain file is missing).
Imported by the scripts beside it (their folder is first on sys.path when run as a script)."""
import gzip
import os
import statistics
import time


def median_ms(step, runs, budget_s):
    """(median wall time of step() in ms, runs timed): at least 3 and at most `runs` runs, fewer
    once budget_s has passed."""
    samples, start = [], time.perf_counter()
    while len(samples) < runs:
        t0 = time.perf_counter()
        step()
        samples.append((time.perf_counter() - t0) * 1000.0)
        if len(samples) >= min(3, runs) and time.perf_counter() - start > budget_s:
            break
    return statistics.median(samples), len(samples)


def idx_bytes(directory, name):
    """(path read, the IDX file's bytes inflated): directory/name, or directory/name.gz when the
    plain file is missing; gzip'd content is recognised by its magic, whatever the name."""
    path = os.path.join(directory, name)
    if not os.path.exists(path):
        path += ".gz"
    with open(path, "rb") as f:
        data = f.read()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    return path, data
