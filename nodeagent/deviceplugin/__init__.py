"""The kubelet device-plugin side of the agent (gRPC API v1beta1), one of the few places importing ``grpc``.

The stubs are shared with the embedded cluster's kubelet stand-in and live in :mod:`hami.kubeletapi`.
``server`` serves the DevicePlugin service, ``kubelet`` registers it with kubelet and restarts it when
kubelet restarts.
"""
