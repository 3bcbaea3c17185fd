"""Kubelet's device-plugin API v1beta1 as gRPC stubs: the one protocol both sides of the socket speak.

``api.proto`` is this project's own transcription of kubelet's documented v1beta1 API; ``api_pb2*.py``
are generated from it by grpcio-tools and committed (the ``_grpc`` module's import of ``api_pb2`` is
edited to the package path after generation). The node agent serves it (``nodeagent.deviceplugin``) and
the embedded cluster's kubelet stand-in calls it (``hami_testkit.kubelet_standin``); nothing else may
import this package.
"""
