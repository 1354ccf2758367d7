"""The cluster cache: slim records of the objects arbiter decides on.

`records` defines the records, `convert` turns raw API objects (dicts) into
them, `store` holds them with the indexes the webhook, loop and extender
read. The watchers that keep the store current live in `watch`.
"""
