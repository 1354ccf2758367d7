"""JobFlow: a DAG of Jobs built from JobTemplates, each going through its queue.

`dag` is the pure decision logic (validation, cycle detection, which step
attempts to create, every step's phase); `patch` builds a Job from a
JobTemplate and a step's overlay; `state` turns observed Jobs and the
flow's previous status into attempts and renders the new status;
`controller` is the leader-only I/O loop; `cli` is `arbiter flow`. The slim
cache records and the spec parser live in `arbiter.cache.jobflow_records`
(the store holds them, and the cache imports nothing from here).
"""
