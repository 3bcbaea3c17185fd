"""The pure allocation core: HAMi's device request, usage, fit and scoring semantics.

Stdlib only. Never imports a Kubernetes client, aiohttp, kopf, grpc or pynvml, never logs, never reads
the clock or the environment: ``now`` and settings come in as arguments.
"""
