"""Actuators: carry an autoscaler plan out on the dev stack, Kubernetes or the simulator."""
