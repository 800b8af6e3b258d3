"""The pure scheduling core: state in, decision out. Imports nothing of gateway, store,
engines or sim, so the live gateway and the virtual-time simulator run the same code."""
