"""Prefill/decode disaggregation: the deciders (a plugin kind) and the step that runs them."""

from taskplane.scheduler.disagg.base import Decider, PDCandidate
from taskplane.scheduler.disagg.deciders import AgentPdDecider, DynamoDisaggDecider, LlmdPdDecider
from taskplane.scheduler.disagg.step import DisaggStep

__all__ = ["AgentPdDecider", "Decider", "DisaggStep", "DynamoDisaggDecider", "LlmdPdDecider", "PDCandidate"]
