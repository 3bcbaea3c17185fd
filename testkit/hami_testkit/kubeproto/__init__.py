"""Kubernetes' protobuf messages as the embedded apiserver reads them: ``k8s.proto`` is this project's
transcription of the fields it keeps (Kubernetes' field numbers), ``k8s_pb2.py`` is generated from it by
grpcio-tools and committed (the command is in ``k8s.proto``). Only :mod:`hami_testkit.protobuf` imports it.
Simulation only.
"""
