"""The cluster cache: slim records of the objects arbiter decides on.

`records` defines the records, `convert` turns raw API objects (dicts) into
them, `jobflow_records` does both for JobFlows and JobTemplates, `store`
holds them with the indexes the webhook, loop and extender read, `naming`
names a consumer's QueueUnit the same way everywhere. The watchers that
keep the store current live in `watch`.
"""
