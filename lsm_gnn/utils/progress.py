"""Progress bars: on a terminal only. Redirected to a file or a pipe (CI, SLURM, ``nohup``), a bar's redraws
would fill the log with carriage returns: there a bar with a description prints one line as it starts (what
the step is and how much of it there is), and the run's own lines (epochs, summaries) say how far it got."""
from __future__ import annotations

import sys


def shows_bars(stream=None) -> bool:
    """Whether a bar drawn on ``stream`` (default stderr, where bars go) would reach a terminal."""
    stream = sys.stderr if stream is None else stream
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a replaced or closed stream
        return False


def progress_bar(enabled: bool = True, **kw):
    """A ``tqdm`` bar on stderr, disabled unless ``enabled`` and stderr is a terminal; ``enabled`` without a
    terminal prints ``"<desc>: <total> <unit>s"`` once instead (log files learn which step runs)."""
    from tqdm.auto import tqdm

    terminal = shows_bars()
    if enabled and not terminal and kw.get("desc"):
        total, unit = kw.get("total"), kw.get("unit", "it")
        units = unit + ("es" if unit.endswith(("s", "x", "ch", "sh")) else "s")
        print(f"{kw['desc']}: {total:,} {units}" if total is not None else f"{kw['desc']}:", file=sys.stderr,
              flush=True)
    return tqdm(disable=not enabled or not terminal, dynamic_ncols=True, file=sys.stderr, **kw)
