"""Bridges from skewwatch's output topics to what a fleet already runs: HAProxy, Alertmanager."""
