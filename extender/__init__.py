"""kube-scheduler extender: filter / prioritize / preempt against queue allocations.

Where a pod is *placed* (webhook: held; loop: admitted; extender: placed).
kube-scheduler calls `POST /scheduler/<verb>`; every answer comes from the
in-memory cache (`arbiter.cache`) and the fair-share engine, never from the
API server.

- `wire`: the extender wire types and strict, case-insensitive parsing;
- `state`: running sums over the cache (node/queue usage, gangs) and the
  pods approved but not yet bound (`assumed`);
- `filter`, `prioritize`, `preempt`: one pure decision per verb;
- `routes`: the aiohttp adapter and metrics; `extender.routes.extender_app`
  is the sub-application `arbiter.server.app` mounts at `/scheduler`.
"""
