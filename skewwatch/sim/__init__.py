"""Synthetic traffic, the project's one source of it: the statistical generator (``skewwatch
generate``), fault injection with ground truth, and the fleet simulator (``skewwatch simulate``)."""
