"""The OpenAI Agents worker's payload converter: the plugin's JSON rules stay on the plugin's
own values, a user's models are written whole (a worker serving both kinds of agent must not
change what a plain taskplane agent's state looks like after ``continue_as_new``)."""

from __future__ import annotations

import json

from openai.types.chat import ChatCompletionMessage
from pydantic import BaseModel

from taskplane.integrations.openai_agents import TaskplanePayloadConverter


class LoopState(BaseModel):
    done: int = 0
    notes: list[str] = []


def test_a_user_model_mutated_in_place_keeps_every_field() -> None:
    conv = TaskplanePayloadConverter()
    state = LoopState()
    state.notes.append("a")  # in place: pydantic still counts `notes` as unset
    state.done += 1
    [payload] = conv.to_payloads([state])
    assert json.loads(payload.data) == {"done": 1, "notes": ["a"]}
    [back] = conv.from_payloads([payload], [LoopState])
    assert back == state
    nested = conv.to_payloads([{"s": [state]}])[0]
    assert json.loads(nested.data) == {"s": [{"done": 1, "notes": ["a"]}]}


def test_the_plugins_models_keep_its_exclude_unset_rule() -> None:
    msg = ChatCompletionMessage(role="assistant", content="hi")
    [payload] = TaskplanePayloadConverter().to_payloads([msg])
    assert json.loads(payload.data) == {"role": "assistant", "content": "hi"}
