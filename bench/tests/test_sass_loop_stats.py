"""scripts/sass_loop_stats.py on a made-up SASS listing: a peeled copy of the products before the
loop, the loop (closed by its own backward branch) and the tile loop's branch around both."""
import pathlib
import subprocess
import sys

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "sass_loop_stats.py"


def listing(ops):
    return "".join(f"        /*{16 * i:04x}*/                   {op} ;\n" for i, op in enumerate(ops))


def run(text):
    return subprocess.run([sys.executable, str(SCRIPT)], input=text, capture_output=True, text=True, check=True).stdout


def test_picks_the_innermost_loop_and_counts_its_r2ur():
    # More than 30 instructions between the peeled block and the loop keep them separate runs.
    head = ["MOV R1, R2",                                     # tile loop head, address 0x0
            "HGMMA.64x128x16.F32.BF16 R24, gdesc[UR8], RZ",  # peeled first block
            "HGMMA.64x128x16.F32.BF16 R88, R152, gdesc[UR8], R88"] + ["FADD R3, R4, R5"] * 40
    loop_head = 16 * len(head)
    loop = ["FMUL R6, R7, R8",                                # key-block loop head
            "R2UR UR8, R4",
            "HGMMA.64x128x16.F32.BF16 R24, gdesc[UR8], RZ",
            "WARPGROUP.ARRIVE",
            "HGMMA.64x128x16.F32.BF16 R88, R152, gdesc[UR8], R88",
            f"@P0 BRA {loop_head:#x}"]                        # closes the key-block loop
    tail = ["@P1 BRA 0x0", "EXIT"]                            # closes the tile loop
    out = run(listing(head + loop + tail))
    assert f"kernel: {len(head + loop + tail)} instructions, 4 HGMMA" in out
    assert "main loop: 6 instructions, 2 HGMMA, 1 R2UR, 1 warpgroup arrive/wait" in out


def test_says_so_when_no_branch_closes_a_loop():
    out = run(listing(["HGMMA.64x128x16.F32.BF16 R24, gdesc[UR8], RZ", "EXIT"]))
    assert "no backward branch" in out
