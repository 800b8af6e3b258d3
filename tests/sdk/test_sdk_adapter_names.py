"""The model string that names a LoRA adapter, as the SDK and the framework adapters send it."""

from __future__ import annotations

import pytest

from taskplane.sdk.llm import with_adapter


@pytest.mark.parametrize(
    ("model", "adapter", "sent"),
    [("m", None, "m"), ("m", "a", "m:a"), ("m:a", "a", "m:a"), ("qwen:7b", "sql", "qwen:7b:sql")],
)
def test_with_adapter(model: str, adapter: str | None, sent: str) -> None:
    assert with_adapter(model, adapter) == sent


def test_framework_models_carry_the_adapter_in_the_model_string() -> None:
    pytest.importorskip("pydantic_ai")
    pytest.importorskip("agents")
    from taskplane.integrations.openai_agents import GatewayModelProvider
    from taskplane.integrations.pydantic_ai import gateway_model

    assert gateway_model("llama-3.1-8b", adapter="tenant-a").model_name == "llama-3.1-8b:tenant-a"
    assert gateway_model("llama-3.1-8b").model_name == "llama-3.1-8b"
    model = GatewayModelProvider("http://127.0.0.1:1").get_model("llama-3.1-8b:tenant-a")
    assert model.model == "llama-3.1-8b:tenant-a"  # type: ignore[attr-defined]
