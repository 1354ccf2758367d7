"""Reclaim: which admitted units to take back, and for whom (DESIGN §3, §4).

    flat     the move rule over flat queues, and preemption inside a queue
    tree     the same rule judged over a tree of queues
    rules    the rule's exact building blocks, shared by both
    room     node fit for a pass: would evicting these let the unit start
    sim      admission and reclaim played offline to their fixpoint
    why      which rule refused which victim, for messages and the decision log
"""
