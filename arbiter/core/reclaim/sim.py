"""Admission and reclaim played out offline, to their fixpoint: what the
admission loop would do from a given allocation, without a cluster (for
`arbiter fairshare` with running units, and for the tests). Pure: no I/O.

A `Simulation` holds an `AdmissionEngine` (progressive filling, DESIGN §4;
`HierarchicalEngine` for a tree of queues, §11)
and plays *rounds* the way the loop does once every queue's grace has
passed: admit whatever fits; then one reclaim pass (`arbiter.core.reclaim.flat.plan`,
every queue due) picks victims; the victims go back to their queues'
waiting lists (a Job is requeued) and the engine admits again, in its own
order. It stops when a pass picks no victim: the fixpoint. The move rule
makes that happen (README, "Reclaim: the exact stopping rule"); `max_rounds`
is only a guard, and `converged` says whether it was needed.

With nodes (DESIGN §10) admission places units on them and each pass
chooses victims with node fit (`arbiter.core.reclaim.room`), as the loop
does; running units are placed first fit, in the order given.

Admission times are a counter, so "most recently admitted" (the victim
order) is the order this simulation admitted units in, the running units
given up front counting as admitted first, in the order given.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence, Set
from dataclasses import dataclass

from arbiter.core.engine import Engine, new_engine
from arbiter.core.model import Node, Placement, Pool, QueueSpec, Unit
from arbiter.core.reclaim.flat import Admitted, ReclaimQueue, Waiting, plan
from arbiter.core.reclaim.room import NodeRoom
from arbiter.core.resources import Resources

__all__ = ["Move", "Simulation", "play", "reclaim_queue"]


@dataclass(frozen=True, slots=True)
class Move:
    """One victim: `unit` of queue `victim` taken back for `for_unit` of `taker`."""

    round: int
    taker: str
    for_unit: str
    victim: str
    unit: str
    guarantee: bool  # the taker was under its guarantee (shares not compared)


def reclaim_queue(spec: QueueSpec, *, priority: int = 0, reclaimable: bool = True) -> ReclaimQueue:
    return ReclaimQueue(spec.name, weight=spec.weight, guarantee=spec.guarantee,
                        capability=spec.capability, priority=priority,
                        reclaimable=reclaimable, parent=spec.parent,
                        child_order=spec.child_order)


class Simulation:
    def __init__(self, capacity: Resources, queues: Iterable[QueueSpec],
                 reclaim: Mapping[str, ReclaimQueue] | None = None,
                 nodes: Iterable[Node] | None = None, pools: Iterable[Pool] = ()) -> None:
        specs = list(queues)
        # The tree engine once some queue has a parent (DESIGN §11), as in the loop.
        self.engine: Engine = new_engine(capacity, specs, nodes, pools)
        self.queues: dict[str, ReclaimQueue] = (
            dict(reclaim) if reclaim is not None else {s.name: reclaim_queue(s) for s in specs})
        self.admitted_at: dict[str, float] = {}
        self.moves: list[Move] = []
        self.rounds = 0
        self.converged = True
        self._tick = 0.0

    def _stamp(self, key: str) -> None:
        self._tick += 1.0
        self.admitted_at[key] = self._tick

    # -- what happens ----------------------------------------------------------------
    def run(self, unit: Unit, placement: Placement | None = None) -> bool:
        """A unit that is admitted already (running); with nodes, where
        `placement` says, else placed first fit in its queue's pools (False,
        and not admitted: no room for it)."""
        view = self.engine.node_view()
        if view is not None and placement is None:
            placement = NodeRoom(view, {}, self.engine.capacity()).placement(unit)
            if placement is None:
                return False
        self.engine.add_admitted(unit, placement)
        self._stamp(unit.key)
        return True

    def submit(self, unit: Unit) -> None:
        """A unit that arrives and waits."""
        self.engine.add_pending(unit)

    def admit(self) -> list[Unit]:
        """Admit whatever fits, in the engine's order."""
        admitted = self.engine.admit_all()
        for unit in admitted:
            self._stamp(unit.key)
        return admitted

    def reclaim_round(self, due: Set[str] | None = None) -> list[Move]:
        """One reclaim pass (queues in `due`, default all); its victims are requeued."""
        engine = self.engine
        running = {unit.key: unit for name in self.queues for unit in engine.admitted(name)}
        candidates = [Admitted(unit.key, unit.queue, unit.demand, unit.priority,
                               self.admitted_at.get(unit.key, 0.0), unit.created)
                      for unit in running.values()]
        waiting = {name: [Waiting(u.key, u.queue, u.demand, u.priority)
                          for u in engine.pending(name)] for name in self.queues}
        view = engine.node_view()
        room = None if view is None else NodeRoom(
            view, {u.key: u for name in self.queues for u in engine.pending(name)},
            engine.capacity())
        decided = plan(engine.capacity(), self.queues, candidates, waiting,
                       due=set(self.queues) if due is None else due,
                       max_victims=len(candidates) + 1, room=room)
        self.rounds += 1
        moves: list[Move] = []
        for victim in decided.victims:
            unit = running[victim.unit.key]
            moves.append(Move(self.rounds, victim.for_queue, victim.for_unit, unit.queue,
                              unit.key, victim.guarantee))
            engine.release(unit.key)
            engine.add_pending(unit)  # requeued, in its old place
            del self.admitted_at[unit.key]
        self.moves.extend(moves)
        return moves

    def settle(self, due: Set[str] | None = None, max_rounds: int = 10_000) -> list[Move]:
        """Admit and reclaim until a pass takes nothing (or `max_rounds` passes)."""
        moves: list[Move] = []
        self.admit()
        for _ in range(max_rounds):
            taken = self.reclaim_round(due)
            if not taken:
                return moves
            moves.extend(taken)
            self.admit()
        self.converged = False
        return moves

    # -- what it comes to -------------------------------------------------------------
    def counts(self) -> dict[str, int]:
        return {name: self.engine.admitted_count(name) for name in self.queues}

    def allocations(self) -> dict[str, Resources]:
        return {name: self.engine.allocated(name) for name in self.queues}


def play(capacity: Resources, queues: Sequence[QueueSpec], running: Sequence[Unit],
         pending: Sequence[Unit], max_rounds: int = 10_000) -> Simulation:
    """Start from `running`, let `pending` arrive, and settle."""
    simulation = Simulation(capacity, queues)
    for unit in running:
        simulation.run(unit)
    for unit in pending:
        simulation.submit(unit)
    simulation.settle(max_rounds=max_rounds)
    return simulation
