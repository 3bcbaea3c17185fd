"""The enforcement check on a real GPU (docs/security.md, "Enforcement modes", "On a real GPU"): the
node agent's Allocate answer applied to a CuPy process the way a container runtime applies it, with
HAMi-core built on that machine. ``device_check.sh`` runs it; ``test_enforcement_gpu.py`` holds the
same claims as tests marked ``gpu``. Needs nothing beyond the standard library, PyYAML and, on the GPU
machine, nvidia-ml-py and CuPy: the device machine has no Kubernetes client."""
