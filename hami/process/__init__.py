"""Process plumbing shared by the three services (``hami scheduler``, ``hami-webhook``, ``hami-node-agent``).

One of each: the ``HAMI_<FLAG>`` env fallback and the ``HOST:PORT`` parser (:mod:`hami.process.flags`,
pure), the set of fire-and-forget background tasks (:mod:`hami.process.tasks`), the Prometheus
``/metrics`` listener (:mod:`hami.process.http`), and an entry point's set-up: logging, one-line
start-up errors, the reachable API client, running until SIGTERM/SIGINT (:mod:`hami.process.entry`).
Sits below the services and above ``hami.kube`` in the import layers: it never imports a service, nor
the Kubernetes client (only ``hami.kube``).
"""
