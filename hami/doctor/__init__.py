"""``hami doctor``: a read-only health check of an installation.

Modules: ``findings`` (the report's types), ``checks`` and ``pods`` (PURE rules: cluster objects and
``now`` in, findings with a severity and what to do out) and ``command`` (the subcommand: reads through
``hami.kube``, reuses the scheduler's snapshot for per-card usage, prints). It sits in its own layer
above the services because it reuses ``hami.scheduler``'s snapshot.
"""
