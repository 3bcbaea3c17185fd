"""The ``hami`` subcommands that talk to a cluster or run the embedded one, one module per command.

Each module exposes ``add_arguments(parser)`` and ``run(args) -> int`` and is loaded lazily by
:mod:`hami.cli`. The commands read and write through ``hami.kube`` and decide through the pure core;
the scheduler process itself (``hami scheduler``) is wired in :mod:`hami.scheduler.main`.
"""
