"""The plugin framework: plugins and their registry, the narrow handle they read, and the
per-decision state they share (a pool of candidates, or the one candidate of a pinned
session). The pipeline that runs them is :mod:`taskplane.scheduler.core`."""
