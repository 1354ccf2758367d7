"""The table of webhook endpoints: path, reviewed kind, decision."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from webhook import jobflows, jobs, pods, queues, queueunits
from webhook.review import AdmissionEnv, AdmissionRequest, Decision

Decide = Callable[[AdmissionRequest, AdmissionEnv], Decision]


@dataclass(frozen=True, slots=True)
class Endpoint:
    # Metric label and the last two path segments: "mutate-pods".
    name: str
    path: str
    group: str
    kind: str
    mutating: bool
    decide: Decide


def _endpoint(mode: str, plural: str, group: str, kind: str, decide: Decide) -> Endpoint:
    return Endpoint(name=f"{mode}-{plural}", path=f"/webhook/{mode}/{plural}", group=group,
                    kind=kind, mutating=mode == "mutate", decide=decide)


ENDPOINTS: tuple[Endpoint, ...] = (
    _endpoint("mutate", "pods", pods.GROUP, pods.KIND, pods.mutate),
    _endpoint("validate", "pods", pods.GROUP, pods.KIND, pods.validate),
    _endpoint("mutate", "jobs", jobs.GROUP, jobs.KIND, jobs.mutate),
    _endpoint("validate", "jobs", jobs.GROUP, jobs.KIND, jobs.validate),
    _endpoint("validate", "queues", queues.GROUP, queues.KIND, queues.validate),
    _endpoint("mutate", "queueunits", queueunits.GROUP, queueunits.KIND, queueunits.mutate),
    _endpoint("validate", "queueunits", queueunits.GROUP, queueunits.KIND, queueunits.validate),
    _endpoint("validate", "jobflows", jobflows.GROUP, jobflows.KIND, jobflows.validate),
)
BY_PATH: dict[str, Endpoint] = {endpoint.path: endpoint for endpoint in ENDPOINTS}
