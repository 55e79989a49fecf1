"""The measurement tools' patches (scripts/fwd_trace, scripts/decode_trace) still apply to the
sources: their build scripts apply them to a copy of src/, so a change to a hooked kernel that
moves the patch's context would otherwise surface only on the GPU machine."""
import pathlib
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("tool", ["fwd_trace", "decode_trace"])
def test_patch_applies(tool, tmp_path):
    if shutil.which("git") is None:
        pytest.skip("needs git")
    for folder in ("src", "include"):
        shutil.copytree(ROOT / folder, tmp_path / folder)
    patch = ROOT / "scripts" / tool / "trace.patch"
    result = subprocess.run(["git", "apply", "--check", str(patch)], cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
