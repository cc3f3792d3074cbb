"""Attacks on the data plane and the deployment, each from a hostile source on 127.0.0.1 (see SECURITY.md)."""
