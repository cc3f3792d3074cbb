"""Tests that start processes or servers: torchrun, nginx, emulators, helm, podman, mkdocs, loader workers."""
