"""Queue resolution and the denials shared by the pod, Job, QueueUnit and
JobFlow webhooks. The resolver itself is `ClusterStore.resolve_queue`, and
which queues a namespace may use is `ClusterStore.queue_admits` (both shared
with the admission loop); this module only explains their answers."""

from __future__ import annotations

from collections.abc import Mapping

from arbiter.cache.access import queue_list
from arbiter.cache.store import ClusterStore, Kind
from arbiter.cache.store import no_queue_message as no_queue_message  # shared with the extender
from arbiter.core.api import QUEUE_LABEL
from webhook.review import ALLOW, AdmissionEnv, Decision, deny

# What the pod, Job and JobFlow webhooks read: a decision taken before
# these kinds were listed once could deny work against a Queue that exists.
QUEUE_KINDS: tuple[Kind, ...] = ("Queue", "Namespace")


def not_ready(env: AdmissionEnv, kinds: tuple[Kind, ...]) -> Decision | None:
    """A retryable denial while the cache has not listed `kinds` yet."""
    missing = [kind for kind in kinds if kind not in env.store.synced_kinds]
    if not missing:
        return None
    return deny(
        f"kube-arbiter is starting and has not loaded {', '.join(missing)} objects yet; "
        "retry in a few seconds",
        code=503,
    )


def not_ready_for(env: AdmissionEnv, namespace: str) -> Decision | None:
    """A retryable denial while the cache cannot yet tell whether work in
    `namespace` is held, and by which queue (arbiter's own namespace and the
    excluded ones never are). Asked before the namespace is judged, by the
    mutating and the validating webhook alike: with two replicas the two
    calls for one object may reach different ones, and a replica still
    loading must not wave through unheld work that a loaded one then
    finds unsuspended (or ungated) and denies for good."""
    if env.store.synced_kinds.issuperset(QUEUE_KINDS) \
            or namespace in env.store.excluded_namespaces:
        return None  # (asked on every review: the common answer first, no list built)
    return not_ready(env, QUEUE_KINDS)


def _source(store: ClusterStore, namespace: str, labels: Mapping[str, str] | None,
            queue: str, what: str) -> str:
    if labels and labels.get(QUEUE_LABEL) == queue:
        return f"the {what}'s {QUEUE_LABEL} label"
    if store.queue_by_namespace.get(namespace) == queue:
        return f'Queue "{queue}" listing namespace "{namespace}"'
    return f'namespace "{namespace}"\'s {QUEUE_LABEL} label'


def check_new_work(
    env: AdmissionEnv,
    namespace: str,
    labels: Mapping[str, str] | None,
    what: str,
) -> Decision:
    """Validate new work (a pod, a Job) in a managed namespace: a retryable
    denial until the cache has listed QUEUE_KINDS, then a denial unless its
    queue resolves, exists and is Open."""
    waiting = not_ready(env, QUEUE_KINDS)
    if waiting is not None:
        return waiting
    queue = env.store.resolve_queue(namespace, labels)
    if queue is None:
        return deny(no_queue_message(namespace, what) + _choices(env.store, namespace))
    return check_open(env, queue, namespace, labels, what) or ALLOW


def _open_choices(store: ClusterStore, namespace: str) -> list[str]:
    """The queues `namespace` may use that accept work now (Open, no children)."""
    return [name for name in store.usable_queues(namespace)
            if store.queues[name].state == "Open" and not store.queue_children.get(name)]


def _choices(store: ClusterStore, namespace: str) -> str:
    usable = _open_choices(store, namespace)
    return f"; it may use {queue_list(usable)}" if usable else ""


def foreign_queue_message(store: ClusterStore, queue: str, namespace: str,
                          subject: str) -> str:
    """Why `namespace` may not use `queue` (DESIGN §13), and which it may use."""
    usable = _open_choices(store, namespace)
    choices = (f'namespace "{namespace}" may use {queue_list(usable)}' if usable else
               f'namespace "{namespace}" may use no queue: ask an admin to list it in a '
               "Queue's spec.namespaces or select it with spec.namespaceSelector")
    return (f'{subject} does not admit namespace "{namespace}" (neither its spec.namespaces '
            f"nor its spec.namespaceSelector): {choices}")


def check_open(
    env: AdmissionEnv,
    queue: str,
    namespace: str,
    labels: Mapping[str, str] | None,
    what: str,
) -> Decision | None:
    """Deny new work for a queue that does not exist, does not admit the
    namespace or is Closed."""
    source = _source(env.store, namespace, labels, queue, what)
    return queue_denial(env.store, queue, f'queue "{queue}" (from {source})', namespace)


def queue_denial(store: ClusterStore, queue: str, subject: str,
                 namespace: str) -> Decision | None:
    """Deny new work in `namespace` for `queue` when it does not exist, does
    not admit the namespace (DESIGN §13), is a parent (§11) or is Closed; the
    message starts with `subject` (which names the queue)."""
    record = store.queues.get(queue)
    if record is None:
        return deny(
            f"{subject} does not exist: create it, or use an existing queue (kubectl get queues)"
        )
    if not store.queue_admits(queue, namespace):
        return deny(foreign_queue_message(store, queue, namespace, subject))
    children = store.queue_children.get(queue)
    if children:
        names = sorted(children)
        shown = ", ".join(f'"{child}"' for child in names[:5])
        more = f" and {len(names) - 5} more" if len(names) > 5 else ""
        return deny(
            f"{subject} is a parent queue and holds no work of its own: use one of its "
            f"children ({shown}{more})"
        )
    if record.state == "Closed":
        return deny(
            f"{subject} is Closed and accepts no new work: reopen it (spec.state: Open) or use "
            "another queue"
        )
    return None
