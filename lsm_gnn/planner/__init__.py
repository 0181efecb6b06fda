"""``lsm-gnn plan``: a throughput model of a training run over a grid of caches (docs/planner.md)."""
from lsm_gnn.planner.model import StageMs, bound_stage, contended_ms, pipeline_ms, recommend, run_ms, steady_ms
from lsm_gnn.planner.plan import format_plan, make_plan, one_type_view

__all__ = ["StageMs", "bound_stage", "contended_ms", "format_plan", "make_plan", "one_type_view", "pipeline_ms",
           "recommend", "run_ms", "steady_ms"]
