"""The pure core: quantities, resource vectors and the fair-share engine.

Nothing under this package performs I/O or imports aiohttp or the Kubernetes
client; everything above it (cache, loop, webhook, extender) builds on it.
"""
