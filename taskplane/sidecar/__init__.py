"""Sidecars in front of replicas: ``pd.py``, the prefill/decode routing sidecar."""
