"""taskplane's endpoint picker and the Envoy data plane in front of it."""
