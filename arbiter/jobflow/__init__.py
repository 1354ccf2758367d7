"""JobFlow: a DAG of Jobs built from JobTemplates, each going through its queue.

`dag` is the pure decision logic (validation, cycle detection, which step
attempts to create, every step's phase); `patch` builds a Job from a
JobTemplate and a step's overlay; `state` turns observed Jobs and the
flow's previous status into attempts and renders the new status; `records`
holds the slim cache records; `controller` is the leader-only I/O loop;
`cli` is `arbiter flow`.
"""
