"""Fig. 12's noise check: DistDGL at the unshaped link and at a link of the SSD's bandwidth, interleaved,
beside our shared mode, each run ``--repeats`` times in one process (the figure's --full ran each setting once).

    sudo python -m benchmarks.paper.fig12_recheck --out docs/results/paper/fig12_recheck.json
"""
from __future__ import annotations

import argparse
import os
import shutil
import tempfile

from benchmarks import distdgl
from benchmarks.paper import fig12
from lsm_gnn.testing.benchmarking import machine_info, write_json


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args(argv)
    cfg = fig12.FULL
    work = tempfile.mkdtemp(prefix="fig12-recheck-", dir="/tmp")
    try:
        dataset, parts, _, ssd, train = fig12.prepare(work, cfg)
        runs = []
        for repeat in range(args.repeats):
            for name, rate in (("unshaped", None), ("link=SSD", ssd * 8 / 1e6)):
                dd = distdgl.run(parts, rate, train, os.path.join(work, f"dd{repeat}{name}"), cfg["link_seconds"])
                runs.append({"system": "distdgl", "link": name, "repeat": repeat, **dd})
            ours = fig12.ours(dataset, cfg, "shared", os.path.join(work, f"ours{repeat}"))
            runs.append({"system": "ours-shared", "repeat": repeat, **ours})
        write_json(args.out, {"config": cfg, "machine": machine_info(), "ssd_bytes_per_s": ssd, "runs": runs})
        for r in runs:
            print(r["system"], r.get("link", ""), r["repeat"], round(r["epoch_s"], 1),
                  {k: round(v, 1) for k, v in r["stages_s"].items() if v})
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
