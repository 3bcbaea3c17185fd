"""The node daemon: card discovery, registration, the kubelet device plugin and the node exporter."""
