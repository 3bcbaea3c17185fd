"""The node agent's MPS back end (``operatingmode: mps``): the node's CUDA MPS control daemon.

``protocol`` (pure) is the daemon's command language and reply parsing; ``control`` runs the daemon
and sends it commands (:class:`nodeagent.mps.control.MpsControl`); ``keeper`` is the agent's periodic
pass (health, restart, namespaces of pods gone); ``metrics`` its Prometheus families. See
docs/node-agent.md, "MPS mode". Must not import ``hami_testkit``, grpc or pynvml.
"""
