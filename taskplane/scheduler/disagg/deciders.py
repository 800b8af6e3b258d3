"""The disaggregation deciders: llm-d's, Dynamo's and taskplane's (agent context)."""

from __future__ import annotations

from dataclasses import dataclass

from taskplane.scheduler.disagg.base import Decider, PDCandidate
from taskplane.scheduler.framework.plugin import param
from taskplane.scheduler.framework.registry import register
from taskplane.scheduler.workflow import call_budget_ms


@dataclass(slots=True)
class LlmdPdParams:
    threshold: int = param(
        0, "prompt tokens not cached on the chosen decode replica at which the prefill runs on a prefill "
        "replica; below it the decode replica serves the whole call (llm-d's pd-profile-handler threshold)"
    )

    def validate(self) -> None:
        if self.threshold < 0:
            raise ValueError("threshold must be >= 0")


@register("llm-d-pd")
class LlmdPdDecider(Decider):
    """llm-d's pd-profile-handler: after the decode profile picked its endpoint, the prefill
    profile runs when the prompt's suffix not cached there is at least ``threshold`` tokens."""

    Params = LlmdPdParams

    def consider(self, c: PDCandidate) -> bool:
        return c.decode_uncached_tokens >= max(self.params.threshold, 1)


@dataclass(slots=True)
class DynamoDisaggParams:
    max_local_prefill_length: int = param(
        1000, "uncached prompt tokens on the decode worker above which the prefill goes remote"
    )
    max_prefill_queue_size: int = param(
        2, "remote prefill only while fewer requests than this wait on the prefill workers"
    )


@register("dynamo-disagg")
class DynamoDisaggDecider(Decider):
    """NVIDIA Dynamo's disaggregated router: remote prefill when the prefill length minus the
    decode worker's prefix hit exceeds ``max_local_prefill_length`` and the prefill queue is
    shorter than ``max_prefill_queue_size``; otherwise the decode worker prefills locally."""

    Params = DynamoDisaggParams

    def consider(self, c: PDCandidate) -> bool:
        p: DynamoDisaggParams = self.params
        return c.decode_uncached_tokens > p.max_local_prefill_length and c.prefill_waiting < p.max_prefill_queue_size


@dataclass(slots=True)
class AgentPdParams:
    min_new_tokens: int = param(
        256, "prompt tokens new to the decode replica below which the call always stays there"
    )
    long_prompt_tokens: int = param(
        1536, "new tokens from which the prefill always moves off the decode replica (it would stall "
        "every decode of its batch for that long)"
    )
    warm_hit_ratio: float = param(
        0.6, "a session whose KV covers this share of the prompt on the decode replica stays there unless "
        "its new tokens reach long_prompt_tokens"
    )
    decode_heavy_running: int = param(
        6, "running requests on the decode replica from which a prefill of min_new_tokens moves off it"
    )
    tight_budget_share: float = param(
        0.5, "the call's share of the task's remaining budget: a predicted local TTFT above this share of it "
        "moves the prefill (when the prefill side is predicted faster)"
    )
    max_remote_ratio: float = param(
        1.5, "keep the call local when the prefill side's predicted TTFT (queue + prefill + KV transfer) "
        "exceeds this times the local prediction"
    )
    kv_bytes_per_token: int = param(131072, "KV bytes per prompt token (8B-class model, bf16) for the transfer estimate")
    link_gb_per_s: float = param(25.0, "prefill-to-decode KV link bandwidth, GB/s, for the transfer estimate")

    def validate(self) -> None:
        if self.link_gb_per_s <= 0:
            raise ValueError("link_gb_per_s must be > 0")


@register("agent-pd")
class AgentPdDecider(Decider):
    """taskplane's decider, from the agent's context: a long *new* prompt, a tight deadline
    budget or a decode-heavy replica disaggregate; a warm session whose KV sits on the decode
    replica does not (its prefill is short there, and a prefill replica would recompute the
    session). The prefill side must not be predicted much slower than prefilling locally."""

    Params = AgentPdParams

    def consider(self, c: PDCandidate) -> bool:
        p: AgentPdParams = self.params
        new = c.decode_uncached_tokens
        if new < p.min_new_tokens:
            return False
        if new >= p.long_prompt_tokens:
            return True
        if c.prompt_hit >= p.warm_hit_ratio:
            return False
        if c.decode.num_running >= p.decode_heavy_running:
            return True
        budget = call_budget_ms(c.request)
        return budget is not None and c.decode_ttft_ms is not None and c.decode_ttft_ms > p.tight_budget_share * budget

    def transfer_ms(self, tokens: float) -> float:
        p: AgentPdParams = self.params
        return tokens * p.kv_bytes_per_token / (p.link_gb_per_s * 1e9) * 1000.0

    def confirm(self, c: PDCandidate, pos: int) -> bool:
        if c.decode_ttft_ms is None:
            return True
        i = int(c.prefill.sel[pos])
        remote = float(c.prefill.prediction.ttft_ms[i]) + self.transfer_ms(c.decode_uncached_tokens)
        return remote <= self.params.max_remote_ratio * max(c.decode_ttft_ms, 1.0)
