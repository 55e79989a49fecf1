"""The CLI's logic on the CPU: shapes and their costs, the sweep end to end on tiny CPU cases, the
registry and plugins, the README block rewrite, ncu's CSV parsing, the ragged lengths."""
import collections
import csv
import hashlib
import os
import sys
import types

import pytest
import torch

from bench import __main__ as cli
from bench import backends, ncu_profile, readme, shapes, varlen


def test_fa_shapes_keep_16k_tokens_and_hidden_2048():
    for seqlen in shapes.SEQLENS:
        for d in shapes.HEADDIMS:
            case = shapes.fa_papers(seqlen, d, False)
            assert case.batch * case.seqlen == 16384 and case.heads * d == 2048


def test_a_probe_spec_names_an_fa_case():
    assert shapes.fa_spec("128:512:causal") == shapes.fa_papers(512, 128, True)
    assert shapes.fa_spec("64:2048") == shapes.fa_papers(2048, 64, False)


def test_flops_bytes_and_rates_follow_fa_formula():
    case = shapes.lecture(4096, 128, causal=False)
    assert case.flops("fwd") == 4 * 2 * 16 * 4096 ** 2 * 128
    assert shapes.lecture(4096, 128, causal=True).flops("fwd") == case.flops("fwd") / 2
    assert case.flops("bwd") == 2.5 * case.flops("fwd") and case.flops("fwdbwd") == 3.5 * case.flops("fwd")
    assert case.bytes_moved("fwd") == 4 * 2 * 4096 * 16 * 128 * 2
    assert case.bytes_moved("bwd") == 2 * case.bytes_moved("fwd")
    tflops, gbps, frac = shapes.rate(case, "fwd", 1.0)
    assert tflops == pytest.approx(case.flops("fwd") / 1e9)
    assert gbps == pytest.approx(case.bytes_moved("fwd") / 1e6)
    assert frac == pytest.approx(tflops / 782.0)


def test_sweep_on_cpu_writes_the_briefs_columns(tmp_path):
    out = tmp_path / "sweep.csv"
    cli.main(["sweep", "--device", "cpu", "--dtype", "fp32", "--shapes", "lecture", "--seqlens", "64",
              "--headdims", "32", "--causal", "yes", "--direction", "fwd", "--runs", "2", "--warmup", "1",
              "--backends", "sdpa-math", "sdpa-cudnn", "--out", str(out), "--plot", "none"])
    rows = list(csv.DictReader(open(out)))
    assert list(rows[0])[:10] == ["seqlen", "headdim", "causal", "shape", "direction", "backend", "ms",
                                  "tflops", "gbps", "frac_peak"]
    assert [(r["backend"], r["direction"], r["causal"]) for r in rows] == [("sdpa-math", "fwd", "1")]
    assert float(rows[0]["ms"]) > 0
    import tileattn
    expected = hashlib.md5(open(tileattn.library_path(), "rb").read()).hexdigest()[:8]
    assert rows[0]["library"] == expected


def test_sweep_repeat_reports_each_backends_median_and_tries_a_skip_once(tmp_path, monkeypatch):
    from bench import sweep

    calls = []
    times = {"sdpa-math": iter([9.0, 3.0, 1.0]), "sdpa-flash": iter(["refused"])}

    def fake_time_backend(backend, case, directions, *rest):
        calls.append(backend.name)
        value = next(times[backend.name])
        return value if isinstance(value, str) else {"fwd": value}

    monkeypatch.setattr(sweep, "time_backend", fake_time_backend)
    out = tmp_path / "sweep.csv"
    cli.main(["sweep", "--device", "cpu", "--dtype", "fp32", "--shapes", "lecture", "--seqlens", "64",
              "--headdims", "32", "--causal", "yes", "--direction", "fwd", "--repeat", "3",
              "--backends", "sdpa-math", "sdpa-flash", "--out", str(out), "--plot", "none"])
    rows = list(csv.DictReader(open(out)))
    assert [(r["backend"], float(r["ms"])) for r in rows] == [("sdpa-math", 3.0)]
    assert rows[0]["rounds_ms"] == "9;3;1"
    assert calls == ["sdpa-math", "sdpa-flash", "sdpa-math", "sdpa-math"]


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 6])
def test_round_orders_put_every_backend_after_every_other_equally_often(n):
    from bench import timing

    rows = timing.round_orders(n)
    assert len(rows) == (2 * n if n % 2 and n > 1 else n)
    assert all(sorted(row) == list(range(n)) for row in rows)
    follows = collections.Counter((row[k], row[k + 1]) for row in rows for k in range(n - 1))
    assert set(follows) == {(a, b) for a in range(n) for b in range(n) if a != b}
    assert len(set(follows.values())) <= 1


def test_sweep_repeat_runs_the_backends_in_balanced_orders(tmp_path, monkeypatch):
    from bench import sweep

    calls = []

    def fake_time_backend(backend, case, directions, *rest):
        calls.append(backend.name)
        return {"fwd": 1.0}

    monkeypatch.setattr(sweep, "time_backend", fake_time_backend)
    cli.main(["sweep", "--device", "cpu", "--dtype", "fp32", "--shapes", "lecture", "--seqlens", "64",
              "--headdims", "32", "--causal", "yes", "--direction", "fwd", "--repeat", "4",
              "--backends", "sdpa-math", "sdpa-flash", "tileattn", "--out", str(tmp_path / "s.csv"),
              "--plot", "none"])
    a, b, c = "sdpa-math", "sdpa-flash", "tileattn"
    assert calls == [a, b, c, c, b, a, b, c, a, a, c, b]


def test_queue_times_back_to_back_calls_and_reports_one_calls_share(monkeypatch):
    from bench import timing

    calls = []
    clock = iter([0.0, 0.030, 1.0, 1.060])  # two samples of 3 calls: 30 ms and 60 ms in all
    monkeypatch.setattr(timing.time, "perf_counter", lambda: next(clock))
    ms = timing.median_ms(lambda: calls.append(1), "cpu", runs=2, warmup=1, queue=3)
    assert len(calls) == 1 + 2 * 3
    assert ms == pytest.approx((10.0 + 20.0) / 2)
    with pytest.raises(ValueError, match="queue"):
        timing.median_ms(lambda: None, "cpu", queue=0)


class _FakeEvent:
    """Stands in for torch.cuda.Event: records which calls came before it, and times a sample by
    the calls between its two events at 10 ms each."""
    log = None

    def __init__(self, enable_timing):
        self.at = None

    def record(self):
        self.at = len(self.log)
        self.log.append("event")

    def synchronize(self):
        pass

    def elapsed_time(self, end):
        return 10.0 * self.log[self.at:end.at].count("call")


def test_a_queued_cuda_sample_starts_after_an_untimed_lead_in_call(monkeypatch):
    """Queued on CUDA, each sample's first call is issued before its start event (so the GPU is busy
    when the event is reached) and not counted; one call at a time, or after `before` (an L2 flush
    the lead-in would undo), there is none."""
    from bench import timing

    log = []
    monkeypatch.setattr(_FakeEvent, "log", log)
    monkeypatch.setattr(timing.torch.cuda, "Event", _FakeEvent)
    monkeypatch.setattr(timing, "synchronize", lambda device: None)
    call = lambda: log.append("call")  # noqa: E731
    assert timing.median_ms(call, "cuda", runs=2, warmup=1, queue=3) == pytest.approx(10.0)
    assert log == ["call"] + ["call", "event", "call", "call", "call", "event"] * 2
    log.clear()
    assert timing.median_ms(call, "cuda", runs=2, warmup=0, queue=1) == pytest.approx(10.0)
    assert log == ["event", "call", "event"] * 2
    log.clear()
    timing.median_ms(call, "cuda", runs=1, warmup=0, queue=3, before=lambda: log.append("flush"))
    assert log == ["flush", "event", "call", "call", "call", "event"]


def test_sweep_passes_queue_to_the_timer(tmp_path, monkeypatch):
    from bench import sweep

    seen = []

    def fake_time_backend(backend, case, directions, device, dtype, limits, runs, warmup, queue):
        seen.append(queue)
        return {"fwd": 1.0}

    monkeypatch.setattr(sweep, "time_backend", fake_time_backend)
    cli.main(["sweep", "--device", "cpu", "--dtype", "fp32", "--shapes", "lecture", "--seqlens", "64",
              "--headdims", "32", "--causal", "yes", "--direction", "fwd", "--queue", "5",
              "--backends", "sdpa-math", "--out", str(tmp_path / "s.csv"), "--plot", "none"])
    assert seen == [5]


def test_dry_run_times_nothing(capsys):
    cli.main(["sweep", "--dry-run", "--device", "cpu", "--seqlens", "512", "--headdims", "64",
              "--backends", "tileattn", "fa1-triton"])
    out = capsys.readouterr().out
    assert "fa1-triton" in out and "skip: needs CUDA" in out and "4 cases x 2 backends" in out


def test_unknown_backend_names_itself():
    with pytest.raises(KeyError, match="nope"):
        backends.get("nope")
    assert backends.get("tileattn@sm90").name == "tileattn@sm90"


def test_family_backend_sets_the_backward_family_only_during_its_backward(monkeypatch):
    """tileattn@VALUE's backward runs after run() returns: the identity nodes around the attention
    set TILEATTN_BACKWARD_FAMILY for the attention's own backward and restore it afterwards."""
    monkeypatch.delenv("TILEATTN_BACKWARD_FAMILY", raising=False)
    seen = []

    class Record(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, grad):
            seen.append(os.environ.get("TILEATTN_BACKWARD_FAMILY"))
            return grad * 2

    x = torch.randn(3, requires_grad=True)
    (inner,) = backends._BackwardFamily.apply(False, "sm80", x)
    (out,) = backends._BackwardFamily.apply(True, "sm80", Record.apply(inner))
    assert os.environ.get("TILEATTN_BACKWARD_FAMILY") is None
    out.sum().backward()
    assert seen == ["sm80"]
    assert os.environ.get("TILEATTN_BACKWARD_FAMILY") is None
    torch.testing.assert_close(x.grad, torch.full((3,), 2.0))


def test_plugin_registers_a_backend(monkeypatch, capsys):
    module = types.ModuleType("bench_test_plugin")
    module.loaded = True
    monkeypatch.setitem(sys.modules, "bench_test_plugin", module)
    backends.register("test-plugin-backend", backward=False)(lambda q, k, v, causal: (lambda: q))
    backends.load_plugins(["bench_test_plugin"])
    assert backends.skip_reason(backends.get("test-plugin-backend"), "cpu", "bwd") == "forward only"
    del backends.REGISTRY["test-plugin-backend"]


def test_readme_rewrites_only_the_marked_block(tmp_path):
    data = tmp_path / "s.csv"
    with open(data, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["seqlen", "headdim", "causal", "shape", "direction", "backend", "ms", "tflops",
                         "gbps", "frac_peak", "batch", "heads", "gpu", "date", "commit"])
        for backend, tflops in (("tileattn", 300.4), ("sdpa-flash", 310.0)):
            writer.writerow([1024, 64, 0, "fa", "fwd", backend, 1.0, tflops, 1, 0.4, 16, 32, "GPU", "2026-01-01", "c"])
    doc = tmp_path / "README.md"
    doc.write_text("head\n<!-- bench:begin -->\nold table\n<!-- bench:end -->\ntail\n")
    cli.main(["readme", "--csv", str(data), "--readme", str(doc)])
    text = doc.read_text()
    assert text.startswith("head\n<!-- bench:begin -->\nGPU fwd") and text.endswith("<!-- bench:end -->\ntail\n")
    assert "| no | 64 | 300/310 |" in text and "old table" not in text
    with pytest.raises(SystemExit, match="expected one"):
        readme.rewrite("no markers", "x")


def test_readme_takes_directions_from_several_csvs(tmp_path):
    header = ["seqlen", "headdim", "causal", "shape", "direction", "backend", "ms", "tflops", "gbps", "frac_peak",
              "batch", "heads", "gpu", "date", "commit"]
    paths = []
    for name, rows in (("fwd.csv", [("fwd", 600.0)]), ("bwd.csv", [("fwd", 1.0), ("bwd", 250.0)])):
        paths.append(tmp_path / name)
        with open(paths[-1], "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(header)
            for direction, tflops in rows:
                writer.writerow([8192, 128, 0, "fa", direction, "tileattn", 1.0, tflops, 1, 0.4, 2, 16, "GPU",
                                 "2026-01-01", "c"])
    doc = tmp_path / "README.md"
    doc.write_text("<!-- bench:begin -->\n<!-- bench:end -->\n")
    cli.main(["readme", "--csv", *map(str, paths), "--readme", str(doc)])
    text = doc.read_text()
    # fwd comes from the first CSV that has it; bwd from the second.
    assert "| no | 128 | 600 |" in text and "| no | 128 | 1 |" not in text and "| no | 128 | 250 |" in text
    assert "GPU fwd" in text and "GPU bwd" in text


def test_ncu_tensor_instruction_names():
    assert ncu_profile.tensor_instruction_name(4096.0) == "mma.sync m16n8k16"
    assert ncu_profile.tensor_instruction_name(65536.1) == "a warp's quarter of a wgmma 64x128x16"
    assert ncu_profile.tensor_instruction_name(5000.0) == "mixed instruction shapes"


def test_ncu_raw_csv_is_parsed_with_units_row_and_separators():
    text = ('==PROF== Connected\nlog line\n"ID","Kernel Name","dram__bytes_read.sum"\n'
            '"","","byte"\n"0","fwd_kernel","1,048,576"\n')
    assert ncu_profile.parse_raw_csv(text)["dram__bytes_read.sum"] == 1048576.0
    assert ncu_profile.choose_metrics({"dram__bytes_read"}, "bf16") == ["dram__bytes_read.sum"]


def test_ragged_lengths_are_fixed_and_capped():
    lengths = varlen.ragged_lengths(32, 1024, 4096)
    assert lengths == varlen.ragged_lengths(32, 1024, 4096)
    assert len(lengths) == 32 and max(lengths) <= 4096 and min(lengths) >= 16
