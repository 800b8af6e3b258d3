"""The thin Python proxy: the OpenAI calls relayed to replicas over HTTP (``--data-plane python``)."""
