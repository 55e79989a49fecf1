"""A progress display: tqdm where it is installed (the GPU image has it), else one stderr line per
step.  Messages go through write() so they do not tear the bar."""
import sys
import time

try:
    from tqdm import tqdm
except ImportError:  # this development machine has no tqdm
    tqdm = None


class Progress:
    def __init__(self, total, desc):
        self.total, self.desc, self.done = total, desc, 0
        self.start = time.perf_counter()
        self.bar = tqdm(total=total, desc=desc, file=sys.stderr, dynamic_ncols=True) if tqdm else None

    def step(self, label):
        self.done += 1
        if self.bar is not None:
            self.bar.set_postfix_str(label, refresh=False)
            self.bar.update(1)
        else:
            elapsed = time.perf_counter() - self.start
            print(f"[{self.desc} {self.done}/{self.total} {elapsed:6.1f}s] {label}", file=sys.stderr, flush=True)

    def write(self, message):
        if self.bar is not None:
            self.bar.write(message)
        else:
            print(message, flush=True)

    def close(self):
        if self.bar is not None:
            self.bar.close()
