"""The admission engines: which waiting unit is admitted next (DESIGN §4).

    flat, flat_state, flat_nodefit    weighted DRF over flat queues, incremental
    tree, tree_state, tree_nodefit    H-DRF over a tree of queues (DESIGN §11)
"""
