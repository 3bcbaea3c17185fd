"""hami: the allocation core, the annotation codec, the Kubernetes adapters and the scheduler extender.

Owns everything the scheduler side needs and what the webhook and node agent share. Never imports
``webhook`` or ``nodeagent``.
"""
