"""The admission engines: which waiting unit is admitted next (DESIGN §4).

    contract                          `Engine`: what every engine answers
    nodefit                           the node-fit book both keep (§10)
    flat, flat_state, flat_nodefit    weighted DRF over flat queues, incremental
    tree, tree_state, tree_nodefit    H-DRF over a tree of queues (§11)

`new_engine` makes the flat-or-tree choice for every caller.
"""

from __future__ import annotations

from collections.abc import Iterable

from arbiter.core.engine.contract import Engine
from arbiter.core.engine.flat import AdmissionEngine
from arbiter.core.engine.tree import HierarchicalEngine, Parented, has_hierarchy
from arbiter.core.model import Node, Pool, QueueSpec
from arbiter.core.resources import Resources

__all__ = ["Engine", "engine_suits", "new_engine"]

# mypy holds both engines to the contract here.
_FLAT: type[Engine] = AdmissionEngine
_TREE: type[Engine] = HierarchicalEngine


def new_engine(capacity: Resources, queues: Iterable[QueueSpec],
               nodes: Iterable[Node] | None = None, pools: Iterable[Pool] = ()) -> Engine:
    """The flat engine, or the tree engine (DESIGN §11) once some queue has a
    parent; with `nodes`, node fit on them (§10)."""
    specs = list(queues)
    if has_hierarchy(specs):
        engine: Engine = HierarchicalEngine(capacity, specs)
        if nodes is not None:
            engine.set_nodes(nodes, pools)
        return engine
    return AdmissionEngine(capacity, specs, nodes, pools)


def engine_suits(engine: Engine, queues: Iterable[Parented]) -> bool:
    """Whether `new_engine` would make an engine of `engine`'s kind for `queues`."""
    return isinstance(engine, HierarchicalEngine) == has_hierarchy(queues)
