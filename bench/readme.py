"""`python3 -m bench readme --csv SWEEP.csv [MORE.csv ...]`: rewrite the block between
<!-- bench:begin --> and <!-- bench:end --> in README.md with a TFLOP/s table per direction (fwd, bwd,
fwdbwd, from whichever CSV holds it) and the sweep's plot.  Nothing outside the markers changes."""
import os
import re

from bench import environment, plots, results

BEGIN, END = "<!-- bench:begin -->", "<!-- bench:end -->"
SHAPE_NOTES = {"fa": "the FA papers' shapes: 16k tokens, hidden 2048", "lecture": "batch 2 x 16 heads"}


def add_parser(subparsers):
    p = subparsers.add_parser("readme", help="rewrite README.md's results block from a sweep CSV",
                              description=__doc__)
    p.add_argument("--csv", required=True, nargs="+", help="sweep CSVs; a direction comes from the first that has it")
    p.add_argument("--readme", default=os.path.join(environment.ROOT, "README.md"))
    p.add_argument("--shape", default=None, help="shape set to show (default: fa if present)")
    p.add_argument("--backends", nargs="+", default=["tileattn", "sdpa-flash", "sdpa-cudnn"])
    p.set_defaults(run=run)


def seqlen_label(n):
    return f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else str(n)


def table(rows, direction, backends):
    """Markdown rows: causal x head dim down, seqlen across, 'a/b/c' TFLOP/s per cell."""
    seqlens = sorted({r["seqlen"] for r in rows})
    value = {(r["causal"], r["headdim"], r["seqlen"], r["backend"]): r["tflops"]
             for r in rows if r["direction"] == direction}
    lines = ["| causal | d | " + " | ".join(seqlen_label(n) for n in seqlens) + " |",
             "|---|---|" + "---|" * len(seqlens)]
    for causal in sorted({r["causal"] for r in rows}):
        for headdim in sorted({r["headdim"] for r in rows}):
            cells = ["/".join(f"{value[causal, headdim, n, b]:.0f}" if (causal, headdim, n, b) in value else "-"
                              for b in backends) for n in seqlens]
            lines.append(f"| {'yes' if causal else 'no'} | {headdim} | " + " | ".join(cells) + " |")
    return lines


def block(csv_paths, readme_path, shape, backends):
    readme_dir = os.path.dirname(os.path.abspath(readme_path))
    command = "python3 -m bench readme --csv " + " ".join(os.path.relpath(p, readme_dir) for p in csv_paths)
    lines = [BEGIN]
    done = set()
    for csv_path in csv_paths:
        lines += csv_tables(csv_path, readme_dir, shape, backends, done, command)
    return "\n".join(lines[:-1] + [END])


def csv_tables(csv_path, readme_dir, shape, backends, done, command):
    """The tables (and plots) of the directions in one CSV that no earlier CSV gave."""
    rows = results.read(csv_path)
    shape = shape or ("fa" if any(r["shape"] == "fa" for r in rows) else rows[0]["shape"])
    rows = [r for r in rows if r["shape"] == shape]
    present = [b for b in backends if any(r["backend"] == b for r in rows)]
    first = rows[0]
    lines = []
    for direction in [d for d in ("fwd", "bwd", "fwdbwd") if any(r["direction"] == d for r in rows)]:
        if direction in done:
            continue
        done.add(direction)
        lines += [f"{first['gpu']} {direction}, TFLOP/s, {' / '.join(present)} ({SHAPE_NOTES.get(shape, shape)}; "
                  f"median of >= 20 calls through the Python API; {first['date']}, commit {first['commit']}; "
                  f"`{command}`):", ""]
        lines += table(rows, direction, present) + [""]
        png = f"{os.path.splitext(csv_path)[0]}-{shape}-{direction}.png"
        if not os.path.exists(png) and plots.available():
            plots.sweep_pngs(csv_path)
        if os.path.exists(png):
            lines += [f"![{direction} sweep]({os.path.relpath(png, readme_dir)})", ""]
    return lines


def rewrite(text, new_block):
    pattern = re.compile(re.escape(BEGIN) + ".*?" + re.escape(END), re.DOTALL)
    if len(pattern.findall(text)) != 1:
        raise SystemExit(f"readme: expected one {BEGIN} ... {END} block")
    return pattern.sub(lambda _: new_block, text)


def run(args):
    with open(args.readme) as f:
        text = f.read()
    new_text = rewrite(text, block(args.csv, args.readme, args.shape, args.backends))
    with open(args.readme, "w") as f:
        f.write(new_text)
    print(f"# rewrote the bench block of {args.readme}")
