"""The kubelet device-plugin side of the agent (gRPC API v1beta1): the only package importing ``grpc``.

``api.proto`` is this project's own transcription of kubelet's documented v1beta1 API; ``api_pb2*.py``
(+ ``.pyi``) are generated from it by grpcio-tools and committed (the ``_grpc`` module's import of
``api_pb2`` is edited to the package path after generation). ``server`` serves the DevicePlugin service,
``kubelet`` registers it with kubelet and restarts it when kubelet restarts.
"""
