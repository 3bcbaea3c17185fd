"""``hami simulate``: replay a pod trace through the production allocation core, the way the ATC '23 paper
"Beware of Fragmentation" measures schedulers (unallocated GPU % against arrived demand).

Modules: ``trace`` (CSV input, checked), ``manifests`` (a folder of pod manifests), ``workload`` (arrival
order, inflation, target workload), ``cluster`` (cards as :class:`~hami.core.model.NodeState` plus a
numpy mirror for the per-pod node mask), ``frag`` (per-node fragmentation, incremental), ``policies``
(the paper's and HAMi's node/card rules), ``fragmentation`` (our rule, built on ``policies``),
``registry`` (every rule by name), ``replay`` (the loop and its metrics), ``report`` (table and JSON),
``plot`` (matplotlib), ``generate`` and ``protocol`` (held-out traces, ``hami heldout``), ``published``
(the measured table of docs/policies.md, ``hami published``), ``live`` (``--kubeconfig``: the only
module that talks to a cluster, through ``hami.kube`` and the scheduler's snapshot). The command lines
are :mod:`hami.commands.simulate`, :mod:`hami.commands.heldout` and :mod:`hami.commands.published`.
Layer: the replay modules import ``hami.core``, ``hami.annotations``, ``hami.settings`` and numpy only.
"""
