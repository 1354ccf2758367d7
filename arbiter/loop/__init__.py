"""The admission loop: what happens to held work, module by module.

A unit's path through the loop, in order:

    index        a consumer (Job, gated pod, pod group) is seen in the store;
                 the loop's indexes say which unit stands for it (by uid)
    units        which QueueUnit should exist and what the loop should do
                 about it (pure decisions on cache records)
    access       whether the unit's queue admits its namespace at all
    writer       the unit is created, or its spec brought up to date
    mirror       the unit enters the engine: pending, admitted or out
    follow       what each store change means for the engine (one piece
                 for the loop and for the debug view of a replica that
                 does not lead)
    nodes        the engine's nodes and pools, kept in step with the cache
    checks       admission checks between quota reservation and release
    controller   a cycle: the engine admits in DRF order; each admission is
                 assumed at once and written (status, then release)
    placement    the pool's nodeSelector and tolerations given to the pods
    inflight     the one owner of in-flight state: writes the watch has not
                 confirmed yet, retries, backoffs, namespace holds, and the
                 units reclaim is taking back (its docstring draws the
                 lifecycle and states each TTL)
    reclaim      when a waiting queue is owed resources: whom to take back
    evict        the writes of reclaim and preemption
    charges      every bound pod counted against exactly one queue
    status, publisher, pool_status, events, decisions
                 what the world sees: Queue and Pool status, QueueUnit
                 positions, metrics, Events, the decision log
    leader, runtime, namespaces
                 leader election, the loop's life under it, and the
                 namespace labels of `--managed-namespaces listed`
    actions      the one place decisions become API writes
"""
