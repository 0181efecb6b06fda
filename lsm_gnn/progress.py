"""Progress bars: on a terminal only. Redirected to a file or a pipe (CI, SLURM, ``nohup``), a bar's redraws
would fill the log with carriage returns; the run's own lines (epochs, summaries) say how far it got there."""
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
    """A ``tqdm`` bar on stderr, disabled unless ``enabled`` and stderr is a terminal."""
    from tqdm.auto import tqdm

    return tqdm(disable=not enabled or not shows_bars(), dynamic_ncols=True, file=sys.stderr, **kw)
