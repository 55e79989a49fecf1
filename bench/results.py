"""The sweep's CSV: the brief's columns first, then what the numbers were measured on, then each
round's time (`--repeat`: ms is their median; the rounds show whether a gap between two backends
is larger than one pass's spread).  Rows are flushed as they come, so a run cut short by a time
limit keeps what it measured."""
import csv
import os

COLUMNS = ("seqlen", "headdim", "causal", "shape", "direction", "backend", "ms", "tflops", "gbps",
           "frac_peak", "batch", "heads", "gpu", "date", "commit", "library", "rounds_ms")


class CsvWriter:
    def __init__(self, path, meta):
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        self.path, self.meta = path, meta
        self.file = open(path, "w", newline="")
        self.writer = csv.DictWriter(self.file, fieldnames=COLUMNS, lineterminator="\n")
        self.writer.writeheader()
        self.file.flush()

    def add(self, case, direction, backend, ms, tflops, gbps, frac_peak, rounds=()):
        """rounds: each round's ms in the order timed, written ';'-joined."""
        self.writer.writerow(dict(
            seqlen=case.seqlen, headdim=case.headdim, causal=int(case.causal), shape=case.shape,
            direction=direction, backend=backend, ms=f"{ms:.5g}", tflops=f"{tflops:.4g}",
            gbps=f"{gbps:.4g}", frac_peak=f"{frac_peak:.3g}", batch=case.batch, heads=case.heads,
            rounds_ms=";".join(f"{r:.5g}" for r in rounds), **self.meta))
        self.file.flush()

    def close(self):
        self.file.close()


def read(path):
    """Rows with numbers parsed: seqlen/headdim/causal/batch/heads as int, the rates as float."""
    rows = []
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            for key in ("seqlen", "headdim", "causal", "batch", "heads"):
                row[key] = int(row[key])
            for key in ("ms", "tflops", "gbps", "frac_peak"):
                row[key] = float(row[key])
            rows.append(row)
    return rows
