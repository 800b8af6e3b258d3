"""taskplane's HTTP API beside the data plane: models, health, metrics, admin, reports, and the OpenAI routes a data plane answers."""
