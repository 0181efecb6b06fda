"""The paper's evaluation, figure by figure, on generated graphs scaled from the paper's datasets.

    python -m benchmarks.paper --quick --out /tmp/paper     # tiny graphs, the code path, in seconds (CI)
    python -m benchmarks.paper --full --out docs/results/paper

Each figure writes its PNG (ours, with the paper's published figures drawn beside) and JSON into ``--out``; one
table of paper vs ours goes to ``paper_vs_ours.md`` there and to stdout. Figures: 9, 10, 11 and 12 (12 needs root:
namespaces and ``tc``). The IGB-medium-shaped run is ``python -m benchmarks.paper.igb_medium`` (docs/paper.md).
"""
from __future__ import annotations

import argparse
import os
import sys

FIGURES = {"9": "benchmarks.paper.fig9", "10": "benchmarks.paper.fig10", "11": "benchmarks.paper.fig11",
           "12": "benchmarks.paper.fig12"}


def table(rows: list[dict]) -> str:
    lines = ["| figure | what | size | paper | ours |", "|---|---|---|---|---|"]
    for r in rows:
        paper = "-" if r["paper"] is None else f"{r['paper']:.2f}"
        lines.append(f"| {r['figure']} | {r['what']} | {r['size']} | {paper} | {r['ours']:.3f} |")
    return "\n".join(lines)


def base_parser(prog: str, doc: str) -> argparse.ArgumentParser:
    """--quick or --full, and --out: what every entry point of the paper's figures takes."""
    parser = argparse.ArgumentParser(prog=prog, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--quick", action="store_true", help="tiny graphs: checks the code path, not the numbers")
    mode.add_argument("--full", action="store_true", help="the documented run (hours)")
    parser.add_argument("--out", required=True, help="directory for the figures, their JSON and the table")
    return parser


def make_out(parser: argparse.ArgumentParser, out: str) -> None:
    if os.path.exists(out) and not os.path.isdir(out):
        parser.error(f"--out {out} is a file; give a directory for the figures (it is made if missing)")
    os.makedirs(out, exist_ok=True)


def main(argv=None) -> int:
    import importlib

    parser = base_parser("python -m benchmarks.paper", __doc__)
    parser.add_argument("--figures", default=",".join(FIGURES), help=f"comma-separated, of {', '.join(FIGURES)}")
    args = parser.parse_args(argv)
    figures = [f.strip() for f in args.figures.split(",") if f.strip()]
    unknown = [f for f in figures if f not in FIGURES]
    if unknown or not figures:
        parser.error(f"--figures: {', '.join(unknown) or 'none given'}; the figures done so far: {', '.join(FIGURES)}")
    make_out(parser, args.out)
    rows = []
    for figure in figures:
        print(f"== Fig. {figure}", file=sys.stderr)
        rows += importlib.import_module(FIGURES[figure]).run(args.out, quick=args.quick)["rows"]
    text = table(rows)
    with open(os.path.join(args.out, "paper_vs_ours.md"), "w") as f:
        f.write(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
