"""Fanouts per relation: the one form the sampler, the cache sizing and the tasks read.

A user or a config gives fanouts as one list for every relation, or per relation; :func:`keyed_fanouts` turns
either into ``{relation: list}`` once, where they are given, so nothing after asks which form they came in (a
graph of one node type has one relation, :data:`~lsm_gnn.data.dataset.ONE_RELATION`)."""
from __future__ import annotations

from collections.abc import Mapping

from lsm_gnn.data.dataset import Relation, relation_key


def keyed_fanouts(fanouts, relations: list[Relation]) -> dict[Relation, list[int]]:
    """Per relation (in the order of ``relations``), its fanout per hop: from one list for all, or a mapping
    {relation or its ``"src__name__dst"`` name: list} that gives every relation as many fanouts as the others."""
    if not isinstance(fanouts, Mapping):
        return {r: _fanout_list(fanouts, "fanouts") for r in relations}
    by_name = {relation_key(r): r for r in relations}
    chosen: dict[Relation, list[int]] = {}
    for key, value in fanouts.items():
        relation = by_name.get(key) if isinstance(key, str) else (key if key in relations else None)
        if relation is None:
            raise ValueError(f"fanouts name the relation {key!r}, which the graph does not have; its relations: "
                             f"{', '.join(by_name)}")
        if relation in chosen:
            raise ValueError(f"fanouts give the relation {relation_key(relation)} twice (as a tuple and a string)")
        chosen[relation] = _fanout_list(value, f"fanouts of {relation_key(relation)}")
    missing = [relation_key(r) for r in relations if r not in chosen]
    if missing:
        raise ValueError(f"fanouts must give every relation; missing: {', '.join(missing)}")
    first = relations[0]
    for r in relations:
        if len(chosen[r]) != len(chosen[first]):
            raise ValueError(f"every relation needs as many fanouts (hops) as the others: {relation_key(r)} has "
                             f"{len(chosen[r])}, {relation_key(first)} has {len(chosen[first])}")
    return {r: chosen[r] for r in relations}


def _fanout_list(value, what: str) -> list[int]:
    """``value`` as one relation's fanouts, checked: a non-empty list of ints >= 0, or -1 for every neighbour."""
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise ValueError(f"{what} must be a list of ints (one per hop), got {value!r}")
    ks = [int(k) for k in value]
    if not ks or any(k < -1 for k in ks):
        raise ValueError(f"{what} must be a non-empty list of ints >= 0 (or -1 for all), got {list(value)}")
    return ks
