"""The only package that talks to the Kubernetes API (through the official ``kubernetes`` client).

Modules: ``protocol`` (:class:`~hami.kube.protocol.KubeApi`, the type of every ``api`` parameter),
``client`` (client factory, request timeout, error types, running sync calls off the event loop),
``nodes``, ``pods``, ``events``, ``nodelock`` (the compare-and-set node lock) and ``watch`` (list + watch
threads feeding an asyncio loop). Objects travel as raw JSON dicts, read through :mod:`hami.objects`.
"""
