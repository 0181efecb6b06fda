"""``lsm-gnn plan``: predicted hit ratio, bytes read and ms per iteration for a grid of caches.

:func:`add_plan_parser` plugs the command into the main program's sub-parsers.
"""
from __future__ import annotations

import argparse
import json
import os
import sys


def _names(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise argparse.ArgumentTypeError(f"expected a comma-separated list, got {text!r}")
    return names


def _plan(args) -> int:
    from lsm_gnn.utils.fileio import check_output_file, write_json_output
    from lsm_gnn.config import load_config
    from lsm_gnn.cli.prepare import shown_by_type
    from lsm_gnn.data import open_dataset
    from lsm_gnn.planner import format_plan, make_plan, one_type_view

    overrides = list(args.overrides)
    config = args.config
    if config and os.path.isdir(config):  # a dataset directory instead of a config file
        overrides.insert(0, f"dataset={config}")
        config = None
    elif config and "=" in config and not os.path.exists(config):
        overrides.insert(0, config)
        config = None
    if args.json and args.json != "-":
        check_output_file(args.json, "--json")
    if args.plot:  # refused before the plan's work, not after it
        from lsm_gnn.cli.plot import check_figure_path, pyplot

        if os.path.isdir(args.plot):
            raise ValueError(f"--plot {args.plot} is a directory; give a PNG file name")
        pyplot()
        check_figure_path(args.plot, "--plot")  # never replaces a file lsm-gnn did not write
    cfg = load_config(config, overrides)
    pvp = {"off": [False], "on": [True], "both": [False, True], None: [cfg.cache.pvp]}[args.pvp]
    plan = make_plan(cfg, sizes=args.sizes or [cfg.cache.capacity], policies=args.policies or [cfg.cache.policy],
                     pvp=pvp, iterations=args.iterations, cores=args.cores,
                     calibration_file=None if args.calibration == "none" else args.calibration,
                     recalibrate=args.recalibrate, train_steps=args.train_steps,
                     storage_seconds=args.storage_seconds, tolerance=args.tolerance / 100)
    if not shown_by_type(open_dataset(cfg.dataset, check="shape")):
        plan = one_type_view(plan)
    if args.json == "-":
        print(json.dumps(plan, indent=2, default=str))
    else:
        print(format_plan(plan))
        if args.json:
            write_json_output(args.json, plan, "lsm-gnn plan", "--json")
    if args.plot:
        from lsm_gnn.cli.plot import draw_plan

        draw_plan(plan, args.plot)
        print(f"wrote {args.plot}", file=sys.stderr if args.json == "-" else sys.stdout)
    return 0


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def add_plan_parser(sub) -> None:
    from lsm_gnn.cli.prepare import number_in
    from lsm_gnn.planner.calibrate import DEFAULT_FILE
    from lsm_gnn.planner.plan import MODELLED_ITERATIONS

    plan = sub.add_parser(
        "plan", help="predict hit ratio, bytes read and ms per iteration for a grid of cache sizes and policies",
        description="Predicts a training run's hit ratio, bytes read and ms per iteration by stage, for every "
                    "cache size x policy given, from the trace of the run's own sampler and a short calibration "
                    "(stored, so later plans are fast). E.g. lsm-gnn plan data/g --sizes 1%,5%,20% "
                    "--policies hybrid,rr sampler.fanouts=[10,5]")
    plan.add_argument("config", nargs="?", help="YAML config, or a dataset directory (then the defaults apply)")
    plan.add_argument("overrides", nargs="*", metavar="key=value", help="dotted config keys, as for train")
    plan.add_argument("--sizes", type=_names, help="cache capacities, comma-separated (default: cache.capacity)")
    plan.add_argument("--policies", type=_names, help="cache policies, comma-separated (default: cache.policy)")
    plan.add_argument("--pvp", choices=("off", "on", "both"), help="victim-buffer prefetcher (default: cache.pvp)")
    plan.add_argument("--iterations", type=_positive, default=None,
                      help="iterations of the run modelled (default: the run's train.epochs x its epoch, or "
                           "train.max_iterations; a longer run: its whole epochs within "
                           f"{MODELLED_ITERATIONS:,} iterations, one at least)")
    plan.add_argument("--cores", type=_positive, default=None, help="CPU cores of the run (default: this machine's)")
    plan.add_argument("--calibration", default=DEFAULT_FILE,
                      help="file that keeps calibrations between plans ('none': measure every time)")
    plan.add_argument("--recalibrate", action="store_true", help="measure again even when the file has it")
    plan.add_argument("--train-steps", type=_positive, default=32, help="training steps timed by the calibration")
    plan.add_argument("--storage-seconds", type=float, default=0.5,
                      help="seconds of random reads per batch size in the storage calibration")
    plan.add_argument("--tolerance", type=number_in(0), default=5.0,
                      help="recommend the smallest cache within this many %% of the fastest (default 5)")
    plan.add_argument("--json", help="also write the plan to this file ('-': print JSON instead of the table)")
    plan.add_argument("--plot", metavar="PNG", help="also draw the plan into this PNG file, as lsm-gnn plot "
                                                    "draws a plan's JSON (needs matplotlib)")
    plan.set_defaults(func=_plan)
