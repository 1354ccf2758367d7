"""First fit in a node set visits only members at or above its floor (the
smallest pod asked of it); these pin the cases where the floor must move:
a smaller pod asked later, a pod that does not request a resource, and a
member that grows back above it."""

from __future__ import annotations

from arbiter.core.model import DEFAULT_POOL, Node
from arbiter.core.placement import NodeIndex, NodeSet

CPU, MEM = 0, 1


def node_set(cpu: list[int], mem: list[int]) -> NodeSet:
    members = list(range(len(cpu)))
    return NodeSet("default", members, tuple(f"n{m:03d}" for m in members), [cpu, mem])


def first_fit(ns: NodeSet, pairs: tuple[tuple[int, int], ...]) -> int:
    """The oracle: the first member with room, by plain scan."""
    return next((m for m in ns.members if all(ns.fr[r][m] >= a for r, a in pairs)),
                len(ns.members))


def test_smaller_pod_asked_later_lowers_the_floor() -> None:
    ns = node_set([1, 2, 9] * 50, [5] * 150)
    big = ((CPU, 8), (MEM, 1))
    assert ns.find(big, 0) == 2 == first_fit(ns, big)
    small = ((CPU, 1), (MEM, 1))
    assert ns.find(small, 0) == 0 == first_fit(ns, small)


def test_pod_without_a_resource_ignores_members_short_of_it() -> None:
    ns = node_set([4] * 130, [0] * 129 + [3])
    assert ns.find(((CPU, 1), (MEM, 1)), 0) == 129
    cpu_only = ((CPU, 2),)
    assert ns.find(cpu_only, 0) == 0 == first_fit(ns, cpu_only)


def test_member_taken_below_the_floor_and_grown_back() -> None:
    ns = node_set([4] * 200, [4] * 200)
    pod = ((CPU, 4), (MEM, 4))
    assert ns.find(pod, 0) == 0
    for m in range(150):
        ns.set_free(m, CPU, 0)
    assert ns.find(pod, 0) == 150 == first_fit(ns, pod)
    ns.set_free(70, CPU, 4)
    assert ns.find(pod, 0) == 70 == first_fit(ns, pod)
    ns.set_free(70, MEM, -1)  # over-committed: below every pod
    assert ns.find(pod, 0) == 150 == first_fit(ns, pod)
    assert ns.find(((CPU, 4),), 0) == 70


def test_a_take_below_a_zero_floor_keeps_the_member_live() -> None:
    """`NodeIndex.take` (the planning path, not `set_free`) clears a member's
    live bit only below a floor above 0: once some pod asks no memory, a
    member over-committed in memory still has room for that pod."""
    index = NodeIndex([Node(f"n{g:03d}") for g in range(130)], [], 2)
    for g in range(130):
        index.free[CPU][g] = index.free[MEM][g] = 4
    ns = index.node_set(DEFAULT_POOL, ())
    both, cpu_only = ((CPU, 1), (MEM, 1)), ((CPU, 1),)
    assert ns.find(both, 0) == 0
    assert ns.find(cpu_only, 0) == 0  # the memory floor is 0 now
    index.take(0, ((MEM, 5),), 1)  # member 0: memory -1
    assert ns.find(cpu_only, 0) == 0 == first_fit(ns, cpu_only)
    assert ns.find(both, 0) == 1 == first_fit(ns, both)
