"""The table of webhook endpoints: path, reviewed kind, decision, and the
configuration entries that send reviews there.

The server serves exactly these paths (`webhook.http`) and the webhook
configurations are derived from the same rows (`webhook.configuration`),
so a path is written once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from arbiter.core.api import ADMISSION_GATE, POD_GROUP_LABEL, QUEUE_LABEL
from arbiter.integrations import OPTIONAL, Integration
from webhook import jobflows, jobs, pods, queues, queueunits, workloads
from webhook.limits import limited
from webhook.review import AdmissionEnv, AdmissionRequest, Decision

Decide = Callable[[AdmissionRequest, AdmissionEnv], Decision]

# Every endpoint's path starts with this (the webhook sub-application's mount point).
PREFIX = "/webhook"

# UPDATE of a pod reaches arbiter only while the pod holds arbiter's gate.
HELD_POD_CONDITION = (
    "has(oldObject.spec.schedulingGates) && "
    f"oldObject.spec.schedulingGates.exists(g, g.name == '{ADMISSION_GATE}')"
)


def _label(side: str, key: str) -> str:
    """CEL: the value of label `key` on `side` ("object", "oldObject"), '' when unset."""
    return (f"(has({side}.metadata.labels) && '{key}' in {side}.metadata.labels ? "
            f"{side}.metadata.labels['{key}'] : '')")


# UPDATE of any pod reaches arbiter when it changes the labels that say
# which queue (and pod group) it is charged to.
POD_LABELS_CONDITION = " || ".join(
    f"{_label('oldObject', key)} != {_label('object', key)}"
    for key in (QUEUE_LABEL, POD_GROUP_LABEL))
# UPDATE of a Job (or an integration's workload) reaches arbiter only when
# arbiter manages it (queue label), or when it has a controller: it may be
# a held workload's child (an LWS's StatefulSets carry no queue label), which
# may not grow past its workload (`webhook.children`).
MANAGED_JOB_CONDITION = (
    "request.operation == 'CREATE' || (has(oldObject.metadata.labels) && "
    f"'{QUEUE_LABEL}' in oldObject.metadata.labels) || "
    "(has(oldObject.metadata.ownerReferences) && "
    "oldObject.metadata.ownerReferences.exists(r, has(r.controller) && r.controller))"
)


@dataclass(frozen=True, slots=True)
class Hook:
    """One entry of a webhook configuration that sends reviews to an endpoint."""

    name: str  # "pods.mutate.arbiter.dev"
    operations: tuple[str, ...]
    # (name, CEL expression) of a matchCondition, if the hook has one.
    condition: tuple[str, str] | None = None
    # A subresource the hook matches instead of the resource ("status").
    subresource: str = ""


@dataclass(frozen=True, slots=True)
class Endpoint:
    # Metric label and the last two path segments: "mutate-pods".
    name: str
    path: str
    group: str
    kind: str
    mutating: bool
    decide: Decide
    # What the configuration's rules match: resource (plural), API version, scope.
    resource: str
    version: str
    namespaced: bool
    hooks: tuple[Hook, ...]

    @property
    def route(self) -> str:
        """The path below `PREFIX`, as the webhook sub-application routes it."""
        return self.path.removeprefix(PREFIX)


def _endpoint(mode: str, plural: str, group: str, kind: str, decide: Decide, *,
              version: str, operations: tuple[str, ...], namespaced: bool = True,
              condition: tuple[str, str] | None = None, also: tuple[Hook, ...] = (),
              resource: str = "") -> Endpoint:
    """An endpoint with its hook `<plural>.<mode>.arbiter.dev`, plus `also`;
    its rules match `resource` (default `plural`)."""
    hooks = (Hook(f"{plural}.{mode}.arbiter.dev", operations, condition), *also)
    return Endpoint(name=f"{mode}-{plural}", path=f"{PREFIX}/{mode}/{plural}", group=group,
                    kind=kind, mutating=mode == "mutate", decide=decide,
                    resource=resource or plural, version=version, namespaced=namespaced,
                    hooks=hooks)


def workload_endpoints(i: Integration, plural: str = "") -> tuple[Endpoint, Endpoint]:
    """An integration's mutating and validating endpoints (`plural` names
    them: a declared kind's is `<resource>.<group>`, which no built-in takes)."""
    return (
        _endpoint("mutate", plural or i.resource, i.group, i.kind, workloads.mutate,
                  version=i.version, operations=(CREATE,), resource=i.resource),
        _endpoint("validate", plural or i.resource, i.group, i.kind,
                  limited(workloads.validate, i.kind), version=i.version,
                  operations=(CREATE, UPDATE), resource=i.resource,
                  condition=("managed-by-arbiter", MANAGED_JOB_CONDITION)))


CREATE, UPDATE, DELETE = "CREATE", "UPDATE", "DELETE"
ENDPOINTS: tuple[Endpoint, ...] = (
    _endpoint("mutate", "pods", pods.GROUP, pods.KIND, pods.mutate,
              version="v1", operations=(CREATE,)),
    _endpoint("validate", "pods", pods.GROUP, pods.KIND, limited(pods.validate, "Pod"),
              version="v1", operations=(CREATE,),
              also=(Hook("pod-gates.validate.arbiter.dev", (UPDATE,),
                         ("held-by-arbiter", HELD_POD_CONDITION)),
                    Hook("pod-labels.validate.arbiter.dev", (UPDATE,),
                         ("queue-labels-change", POD_LABELS_CONDITION)),
                    # In-place resize (Kubernetes 1.33+) is its own subresource.
                    Hook("pod-resize.validate.arbiter.dev", (UPDATE,), subresource="resize"))),
    _endpoint("mutate", "jobs", jobs.GROUP, jobs.KIND, jobs.mutate,
              version="v1", operations=(CREATE,)),
    _endpoint("validate", "jobs", jobs.GROUP, jobs.KIND, limited(jobs.validate, "Job"),
              version="v1", operations=(CREATE, UPDATE),
              condition=("managed-by-arbiter", MANAGED_JOB_CONDITION)),
    _endpoint("validate", "queues", queues.GROUP, queues.KIND, queues.validate,
              version="v1alpha1", operations=(CREATE, UPDATE, DELETE), namespaced=False),
    _endpoint("mutate", "queueunits", queueunits.GROUP, queueunits.KIND, queueunits.mutate,
              version="v1alpha1", operations=(CREATE, UPDATE)),
    _endpoint("validate", "queueunits", queueunits.GROUP, queueunits.KIND,
              limited(queueunits.validate, "QueueUnit"), version="v1alpha1",
              operations=(CREATE, UPDATE),
              also=(Hook("queueunit-status.validate.arbiter.dev", (UPDATE,),
                         subresource="status"),)),
    _endpoint("validate", "jobflows", jobflows.GROUP, jobflows.KIND, jobflows.validate,
              version="v1alpha1", operations=(CREATE, UPDATE)),
    # One pair per optional integration, whether it is switched on or not
    # (`--integrations` is the server's; a kind switched off passes untouched).
    *(endpoint for i in OPTIONAL for endpoint in workload_endpoints(i)),
)
# The declared kinds' endpoints (arbiter.integrations.declared), added at
# startup by `webhook.declared.register`.
DECLARED: list[Endpoint] = []
BY_PATH: dict[str, Endpoint] = {endpoint.path: endpoint for endpoint in ENDPOINTS}


def served() -> tuple[Endpoint, ...]:
    """Every endpoint the server serves: the table, then the declared kinds'."""
    return (*ENDPOINTS, *DECLARED)
