"""Which consumer a pod belongs to, and so which QueueUnit holds it: the one
decision, shared by the loop (which creates the units) and the extender
(which looks a pod's unit up).

A pod of a Job belongs to the Job, a pod labelled with a pod group to the
group, any other pod to itself; each consumer has one unit, named by
`arbiter.api` in the pod's namespace.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from arbiter.api import group_unit_name, job_unit_name, pod_unit_name
from arbiter.cache.records import PodRecord

ConsumerKind = Literal["Job", "Pod", "PodGroup"]


@dataclass(frozen=True, slots=True)
class ConsumerKey:
    """What a unit stands for, by kind, namespace and name (not uid: a
    deleted consumer must still find the unit it leaves behind)."""

    kind: ConsumerKind
    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.kind}/{self.namespace}/{self.name}"

    @property
    def unit_name(self) -> str:
        """The name of this consumer's QueueUnit."""
        if self.kind == "Job":
            return job_unit_name(self.name)
        if self.kind == "PodGroup":
            return group_unit_name(self.name)
        return pod_unit_name(self.name)

    @property
    def unit_key(self) -> str:
        """`namespace/name` of this consumer's QueueUnit, as the store keys it."""
        return f"{self.namespace}/{self.unit_name}"


def pod_consumer(pod: PodRecord) -> ConsumerKey:
    """The consumer a pod belongs to: its Job, else its pod group, else itself."""
    if pod.job_name:
        return ConsumerKey("Job", pod.namespace, pod.job_name)
    if pod.pod_group:
        return ConsumerKey("PodGroup", pod.namespace, pod.pod_group)
    return ConsumerKey("Pod", pod.namespace, pod.name)
