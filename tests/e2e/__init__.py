"""The chart's rendered pods run end to end with podman, the harness playing Kubernetes (see conftest.py)."""
