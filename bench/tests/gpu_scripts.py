"""Loads a bench/gpu script as a module for the tests that check its pure parts on the CPU."""
import importlib.util
import pathlib
import sys

GPU_DIR = pathlib.Path(__file__).resolve().parents[1] / "gpu"


def load_gpu_script(name):
    """bench/gpu/NAME.py as a module; the scripts import bench/gpu/timing.py by name."""
    if str(GPU_DIR) not in sys.path:
        sys.path.insert(0, str(GPU_DIR))
    spec = importlib.util.spec_from_file_location(name, GPU_DIR / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
