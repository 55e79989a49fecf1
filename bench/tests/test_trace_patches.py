"""The patches kept beside the sources still apply to them: the measurement tools' trace patches
(scripts/fwd_trace, scripts/decode_trace), whose build scripts apply them to a copy of src/, and the
prepared experiments (experiments/*/*.patch), which a session applies before building.  A change
to a hooked file that moves a patch's context would otherwise surface only when it is next used."""
import pathlib
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PATCHES = [ROOT / "scripts" / tool / "trace.patch" for tool in ("fwd_trace", "decode_trace")]
PATCHES += sorted((ROOT / "experiments").glob("*/*.patch"))


@pytest.mark.parametrize("patch", PATCHES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_patch_applies(patch, tmp_path):
    if shutil.which("git") is None:
        pytest.skip("needs git")
    for folder in ("src", "include", "tests", "scripts"):
        shutil.copytree(ROOT / folder, tmp_path / folder)
    result = subprocess.run(["git", "apply", "--check", str(patch)], cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
