"""A bounded, seeded generator of hostile requests for every HTTP surface:
malformed AdmissionReviews for every webhook path and kind, and malformed
ExtenderArgs for filter, prioritize and preempt.

Each case starts from a valid body and is damaged in one to four places
(a value replaced by a wrong type, nesting ~1,000 deep, a huge number, a
thousand-digit quantity, a long string; a key deleted), or replaced by
junk; its bytes may then be truncated, or sent under a Content-Encoding
they are not in. Used by the fuzz tests (a seeded slice) and by
`bench/fuzz_surfaces.py` (tens of thousands over real HTTP).
"""

from __future__ import annotations

import copy
import random
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

from arbiter.cache.store import ClusterStore
from arbiter.server.app import build_app, extender_state
from arbiter.server.context import ServerContext
from extender import routes as extender_routes
from tests.extender import builders as b
from tests.webhook.admission_samples import (
    QUEUE_LABEL,
    job,
    job_pod,
    kubectl_run_pod,
    namespace_obj,
    queue_obj,
    review,
    unit_obj,
)
from webhook.endpoints import ENDPOINTS

Json = Any
WEBHOOK_PATHS: dict[str, list[str]] = {}
for _endpoint in ENDPOINTS:
    WEBHOOK_PATHS.setdefault(_endpoint.kind, []).append(_endpoint.path)
EXTENDER_VERBS = ("filter", "prioritize", "preempt")
NODES = [f"node-{i}" for i in range(4)]

# Raw JSON text spliced in where a marker string stands: orjson will not
# write 255+ levels of nesting, nor integers past 64 bits.
_DEEP = "[" * 1000 + "]" * 1000
_DEEP_OBJECT = '{"a":' * 900 + "1" + "}" * 900
_RAW_TOKENS = {
    "@@deep@@": _DEEP,
    "@@deep-object@@": _DEEP_OBJECT,
    "@@huge-int@@": "9" * 400,           # a float of 1e400: orjson refuses it (400)
    "@@big-int@@": "1" + "0" * 30,       # parsed as a float
    "@@neg-big@@": "-" + "9" * 25,
}
_SCALARS: list[Json] = [
    None, True, False, 0, -1, 1, 2**63 - 1, -(2**63), 2**64 - 1, 1.5, -0.0, 1e308, "",
    "CREATE", "UPDATE", "DELETE", "Pod", "Job", "v1", "team-a", "closed", "Running",
    "Dequeued", "arbiter.dev/admission", "100m", "1Gi", "-1", "1e400", "0.000000001n",
    "1" * 4400, "1" * 5000 + "m", "1e" + "9" * 4400, "9" * 128, "x" * 70_000,
    "\u0000", "\ud7ff\ue000", "../..", "a/b/c", "CPU", "cpu ",
]


def _hostile_value(rng: random.Random, depth: int = 0) -> Json:
    roll = rng.random()
    if roll < 0.15:
        return rng.choice(list(_RAW_TOKENS))
    if roll < 0.6 or depth > 2:
        return rng.choice(_SCALARS)
    if roll < 0.8:
        return [_hostile_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    return {rng.choice(["name", "cpu", "memory", "phase", "count", "x", "", "nvidia.com/gpu"]):
            _hostile_value(rng, depth + 1) for _ in range(rng.randrange(4))}


def json_paths(node: Json, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield prefix
    if isinstance(node, dict):
        for key, value in node.items():
            yield from json_paths(value, (*prefix, key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from json_paths(value, (*prefix, index))


def _damage(rng: random.Random, document: Json) -> Json:
    document = copy.deepcopy(document)
    for _ in range(rng.randint(1, 4)):
        paths = list(json_paths(document))[1:]
        if not paths:
            return _hostile_value(rng)
        path = rng.choice(paths)
        parent = document
        for token in path[:-1]:
            parent = parent[token]
        if isinstance(parent, dict) and rng.random() < 0.25:
            del parent[path[-1]]
        else:
            parent[path[-1]] = _hostile_value(rng)
    return document


def encode(document: Json) -> bytes:
    text = orjson.dumps(document).decode()
    for marker, raw in _RAW_TOKENS.items():
        text = text.replace(f'"{marker}"', raw)
    return text.encode()


def webhook_bases() -> list[tuple[str, Json]]:
    """(kind, valid AdmissionReview) for every kind and operation reviewed."""
    held = kubectl_run_pod("held", "team-a", labels={QUEUE_LABEL: "team-a"}, validating=True)
    held["spec"]["schedulingGates"] = [{"name": "arbiter.dev/admission"}]
    gpu_pod = kubectl_run_pod("gpu", "team-a")
    gpu_pod["spec"]["containers"][0]["resources"] = {
        "requests": {"cpu": "4"}, "limits": {"nvidia.com/gpu": "1"}}
    unit_spec = {"queue": "team-a", "podSets": [{"name": "main", "count": 2, "minCount": 1,
                                                 "requests": {"cpu": "1"}}]}
    labelled_job = job("j", "team-a", labels={QUEUE_LABEL: "team-a"}, suspend=True,
                       template_labels={QUEUE_LABEL: "team-a"})
    unit = unit_obj("u", "team-a", unit_spec, phase="Running")
    flow = {"apiVersion": "arbiter.dev/v1alpha1", "kind": "JobFlow",
            "metadata": {"name": "demo", "namespace": "team-a"},
            "spec": {"flows": [{"name": "a"}, {"name": "b", "dependsOn": {
                "targets": ["a"], "condition": "Succeeded"}, "maxRetries": 1,
                "patch": {"template": {"spec": {"containers": [{"name": "c"}]}}}}]}}
    flow_review = review("Queue", "CREATE", None)
    flow_review["request"].update({
        "kind": {"group": "arbiter.dev", "version": "v1alpha1", "kind": "JobFlow"},
        "resource": {"group": "arbiter.dev", "version": "v1alpha1", "resource": "jobflows"},
        "operation": "UPDATE", "namespace": "team-a", "name": "demo",
        "object": flow, "oldObject": copy.deepcopy(flow)})
    return [
        ("Pod", review("Pod", "CREATE", kubectl_run_pod("web", "team-a"))),
        ("Pod", review("Pod", "CREATE", gpu_pod)),
        ("Pod", review("Pod", "CREATE", job_pod("j", "team-a", queue="team-a"))),
        ("Pod", review("Pod", "UPDATE", held, old=copy.deepcopy(held))),
        ("Job", review("Job", "CREATE", job("j", "team-a"))),
        ("Job", review("Job", "UPDATE", labelled_job, old=copy.deepcopy(labelled_job))),
        ("Queue", review("Queue", "CREATE", queue_obj(
            "q", guarantee={"cpu": "1"}, capability={"cpu": "2", "nvidia.com/gpu": "1"},
            namespaces=["x"], parent="team-a"))),
        ("Queue", review("Queue", "DELETE", None, old=queue_obj("team-a"))),
        ("QueueUnit", review("QueueUnit", "CREATE", unit_obj("u", "team-a", unit_spec))),
        ("QueueUnit", review("QueueUnit", "UPDATE", copy.deepcopy(unit), old=unit)),
        ("QueueUnit", review("QueueUnit", "CREATE", unit_obj(
            "u", "team-a", {"resourceUnit": {"cpu": "1"}, "resourceNo": 2}))),
        ("JobFlow", flow_review),
    ]


def extender_bases() -> list[tuple[str, Json]]:
    """(verb, valid ExtenderArgs or ExtenderPreemptionArgs)."""
    pod = b.pod("p")
    queued = b.pod("q", queue_name="b", job="j")
    return [
        ("filter", b.extender_args(pod, NODES)),
        ("filter", b.extender_args(queued, NODES)),
        ("filter", b.extender_args_nodes(queued, [b.node(n) for n in NODES])),
        ("prioritize", b.extender_args(queued, NODES)),
        ("prioritize", b.extender_args_nodes(pod, [b.node(n) for n in NODES])),
        ("preempt", b.preemption_args(b.pod("p", priority=9),
                                      {n: [b.uid()] for n in NODES})),
        ("preempt", {"Pod": b.pod("p"), "NodeNameToMetaVictims": None, "NodeNameToVictims": {
            "node-0": {"Pods": [b.pod("v", node_name="node-0", queue_name="b")],
                       "NumPDBViolations": 0}}}),
    ]


def one_port_app(ctx: ServerContext) -> web.Application:
    """The webhook's application with the extender mounted beside it, so
    one plain-HTTP port answers both surfaces (`arbiter serve` gives the
    extender a listener of its own)."""
    app = build_app(ctx, background=False)
    app.add_subapp(extender_routes.PREFIX, extender_routes.extender_app(
        extender_state(ctx.store, ctx.config), max_body=ctx.config.extender_max_body_bytes))
    return app


def world() -> ClusterStore:
    """A synced store both surfaces can answer from."""
    store = b.synced_store()
    for index, name in enumerate(NODES):
        store.apply("Node", "ADDED", b.node(name, labels={"pool": "x"} if index % 2 else {}))
    for queue in (queue_obj("team-a", namespaces=["team-a"]), queue_obj("x", parent="team-a"),
                  b.queue("a", capability={"cpu": "3"}),
                  b.queue("b", node_selector={"pool": "x"})):
        store.apply("Queue", "ADDED", queue)
    store.apply("Namespace", "ADDED", namespace_obj("team-a"))
    store.apply("QueueUnit", "ADDED", b.unit("team-a", "job-j", "b", phase="Running", count=4))
    store.apply("QueueUnit", "ADDED", b.unit("team-a", "pod-p", "a", phase="Dequeued"))
    store.apply("JobTemplate", "ADDED", {"metadata": {"name": "a", "namespace": "team-a"},
                                         "spec": {"template": {}}})
    store.apply("JobTemplate", "ADDED", {"metadata": {"name": "b", "namespace": "team-a"},
                                         "spec": {"template": {}}})
    store.synced_kinds.update({"JobFlow", "JobTemplate"})
    for index, name in enumerate(NODES):
        store.apply("Pod", "ADDED", b.pod(f"j-{index}", queue_name="b", job="j",
                                          node_name=name, phase="Running"))
    return store


@dataclass(frozen=True, slots=True)
class Case:
    surface: str  # "webhook" or "extender"
    path: str
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)
    # The review's uid, when the body is intact enough that an answer must echo it.
    uid: str | None = None
    # Send fewer bytes than Content-Length says, then half-close.
    short_by: int = 0


@dataclass
class Generator:
    seed: int
    rng: random.Random = field(init=False)
    webhook: list[tuple[str, Json]] = field(default_factory=webhook_bases)
    extender: list[tuple[str, Json]] = field(default_factory=extender_bases)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)

    def _transport(self, case: Case) -> Case:
        """Damage the bytes on the way: truncated, a false encoding, a short body."""
        roll = self.rng.random()
        if roll < 0.06:
            cut = self.rng.randrange(max(1, len(case.body)))
            return Case(case.surface, case.path, case.body[:cut])
        if roll < 0.10:
            # Not br or zstd: without their optional packages aiohttp's own parser
            # refuses them before any handler runs (a 400, but with its traceback).
            encoding = self.rng.choice(["gzip", "deflate", "x-gzip", "identity, gzip",
                                        "compress"])
            return Case(case.surface, case.path, case.body,
                        headers={"Content-Encoding": encoding})
        if roll < 0.11:
            return Case(case.surface, case.path, case.body,
                        short_by=self.rng.randint(1, 100))
        return case

    def review(self) -> Case:
        kind, base = self.rng.choice(self.webhook)
        path = self.rng.choice(WEBHOOK_PATHS[kind])
        document = copy.deepcopy(base)
        document["request"]["uid"] = str(uuid.UUID(int=self.rng.getrandbits(128)))
        roll = self.rng.random()
        if roll < 0.05:
            document = _hostile_value(self.rng)
        elif roll < 0.10:
            document["request"] = _hostile_value(self.rng)
        elif roll < 0.80:
            obj = document["request"].get("object") or document["request"].get("oldObject")
            key = "object" if document["request"].get("object") is not None else "oldObject"
            document["request"][key] = _damage(self.rng, obj)
            if self.rng.random() < 0.2 and document["request"].get("oldObject") is not None:
                document["request"]["oldObject"] = _damage(
                    self.rng, document["request"]["oldObject"])
        else:
            document = _damage(self.rng, document)
        uid = None
        request = document.get("request") if isinstance(document, dict) else None
        if isinstance(request, dict) and isinstance(request.get("uid"), str):
            uid = request["uid"]
        return self._transport(Case("webhook", path, encode(document), uid=uid))

    def extender_args(self) -> Case:
        verb, base = self.rng.choice(self.extender)
        if self.rng.random() < 0.15:
            verb = self.rng.choice(EXTENDER_VERBS)  # the wrong args for the verb
        document = _damage(self.rng, base) if self.rng.random() < 0.9 \
            else _hostile_value(self.rng)
        return self._transport(Case("extender", f"/scheduler/{verb}", encode(document)))

    def cases(self, reviews: int, extender_args: int) -> Iterator[Case]:
        """Interleaved, `reviews` + `extender_args` cases in all."""
        kinds = ["webhook"] * reviews + ["extender"] * extender_args
        self.rng.shuffle(kinds)
        for surface in kinds:
            yield self.review() if surface == "webhook" else self.extender_args()


# -- sending and judging ------------------------------------------------------
@dataclass
class Tally:
    sent: int = 0
    by_status: dict[int, int] = field(default_factory=dict)
    uid_echo_failures: int = 0
    # Answers that break the contract (a 5xx, a 400 of many lines, ...): a few kept.
    problems: list[str] = field(default_factory=list)
    problem_count: int = 0

    @property
    def server_errors(self) -> int:
        return sum(count for status, count in self.by_status.items() if status >= 500)

    def record(self, case: Case, status: int, payload: bytes) -> None:
        self.sent += 1
        self.by_status[status] = self.by_status.get(status, 0) + 1
        problem = judge(case, status, payload)
        if problem is None:
            return
        if problem.startswith("uid"):
            self.uid_echo_failures += 1
        self.problem_count += 1
        if len(self.problems) < 10:
            self.problems.append(f"{case.path}: {problem} (body {case.body[:160]!r})")


def judge(case: Case, status: int, payload: bytes) -> str | None:
    """What is wrong with this answer to `case`, or None."""
    if status not in (200, 400):
        return f"HTTP {status}: {payload[:200]!r}"
    if status == 400:
        text = payload.decode(errors="replace")
        if not text.endswith("\n") or text.count("\n") != 1 or len(text) < 2:
            return f"400 not one line: {text[:200]!r}"
        return None
    try:
        answer = orjson.loads(payload)
    except orjson.JSONDecodeError:
        return f"200 with a body that is not JSON: {payload[:200]!r}"
    if case.surface == "extender":
        return None
    response = answer.get("response") if isinstance(answer, dict) else None
    if not isinstance(response, dict) or not isinstance(response.get("allowed"), bool):
        return f"200 that is no AdmissionReview response: {payload[:200]!r}"
    if case.uid is not None and response.get("uid") != case.uid:
        return f"uid not echoed: sent {case.uid}, got {response.get('uid')!r}"
    return None


async def _send_short(port: int, case: Case) -> tuple[int, bytes]:
    """Declare the whole body, send less, half-close: the server must still answer."""
    import asyncio

    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        sent = case.body[:max(0, len(case.body) - case.short_by)]
        writer.write(f"POST {case.path} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                     "Content-Type: application/json\r\nConnection: close\r\n"
                     f"Content-Length: {len(case.body)}\r\n\r\n".encode() + sent)
        await writer.drain()
        writer.write_eof()
        raw = await asyncio.wait_for(reader.read(), timeout=30)
    finally:
        writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    if not head:
        return 400, b"connection closed without an answer\n"  # the client gave up first
    return int(head.split(b" ", 2)[1]), body


async def run_cases(cases: Iterator[Case], port: int, *, concurrency: int = 8,
                    tally: Tally | None = None) -> Tally:
    """POST every case to 127.0.0.1:`port`, `concurrency` at a time."""
    import asyncio

    import aiohttp

    tally = tally if tally is not None else Tally()
    connector = aiohttp.TCPConnector(limit=concurrency)
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout,
                                     auto_decompress=False) as session:
        async def one(case: Case) -> None:
            try:
                if case.short_by:
                    status, payload = await _send_short(port, case)
                else:
                    headers = {"Content-Type": "application/json", **case.headers}
                    if case.headers:
                        # The server closes a connection whose body it could not read.
                        headers["Connection"] = "close"
                    async with session.post(f"http://127.0.0.1:{port}{case.path}",
                                            data=case.body, headers=headers) as answer:
                        status, payload = answer.status, await answer.read()
            except (aiohttp.ClientError, OSError, TimeoutError) as error:
                status, payload = 0, f"client error: {error!r}".encode()
            tally.record(case, status, payload)

        pending: set[asyncio.Task[None]] = set()
        for case in cases:
            if len(pending) >= concurrency:
                _, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            pending.add(asyncio.create_task(one(case)))
        if pending:
            await asyncio.gather(*pending)
    return tally
