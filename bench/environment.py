"""What a result was measured on: device name, date, commit (a placeholder where the copy has no
.git, as on the GPU machine: the coordinator fills it in when committing)."""
import datetime
import hashlib
import os
import platform
import subprocess

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "bench", "results")


def device_name(device):
    if torch.device(device).type == "cuda":
        return torch.cuda.get_device_name()
    return f"cpu ({platform.machine()}, {os.cpu_count()} cores)"


def today():
    return datetime.date.today().isoformat()


def commit():
    """TILEATTN_COMMIT when set (bench/run_on_device.sh sets the placeholder 'commit': the device's
    copy of .git need not be the tree that ran), else the checkout's short commit, else 'commit'."""
    if os.environ.get("TILEATTN_COMMIT"):
        return os.environ["TILEATTN_COMMIT"]
    try:
        return subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "commit"


def library_md5():
    """The first 8 hex digits of the loaded libtileattn's md5, or 'none' when it cannot load: on the
    GPU machine the copy's .git can be older than the tree that ran (sweeps v27-v29's commit column
    named earlier commits), while the library's md5 names the kernels that ran."""
    try:
        import tileattn
        path = tileattn.library_path()
    except Exception:  # no library built or loadable: the CSV says so instead of failing the sweep
        return "none"
    digest = hashlib.md5()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()[:8]


def free_bytes(device):
    """Memory a case may use: free device memory on CUDA, unbounded on the CPU."""
    if torch.device(device).type == "cuda":
        return torch.cuda.mem_get_info()[0]
    return float("inf")
