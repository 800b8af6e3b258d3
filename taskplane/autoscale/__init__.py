"""The fleet autoscaler: a pure core (signals in, plan out), actuators beside it."""
