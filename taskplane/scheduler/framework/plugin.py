"""Plugins: filters, then weighted normalised scorers, then a picker.

Modelled on the Kubernetes scheduler framework and llm-d's endpoint picker. Each plugin is a
small class with one job, a registered type name, a ``Params`` dataclass whose every field
documents its default and meaning (``param(default, doc)``), and its own metrics. Adding an
axis means adding a plugin, not editing a long function.

* a **filter** returns a boolean mask over the current candidates (None keeps them all);
* a **scorer** returns one score in [0, 1] per candidate, higher is better; the decision
  adds the scores times their configured weights;
* a **picker** chooses one candidate, by default the highest total, ties broken by a
  seeded random generator so runs are reproducible.

Capabilities instead of names: a plugin that reads the KV index says through which source
(``kv_source``); a plugin that keeps state across decisions is :class:`Stateful` and gets
the lifecycle hooks (placed, completed, replica failed or removed); one that keeps session
pins offers them to every other plugin as ``sessions`` (a read-only view in the handle).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from taskplane.scheduler.framework.handle import Handle, SessionsView
from taskplane.scheduler.framework.one import OneCandidate
from taskplane.scheduler.framework.state import CycleState
from taskplane.scheduler.metrics import FILTERED, PLUGIN_SCORE
from taskplane.scheduler.types import CallOutcome, CallRequest, Decision, ReplicaView


def param(default: Any, doc: str) -> Any:
    """A documented plugin parameter (``dataclasses.field`` with its help text)."""
    if isinstance(default, list | dict | set):
        factory = type(default)
        items = default
        return field(default_factory=lambda: factory(items), metadata={"doc": doc})
    return field(default=default, metadata={"doc": doc})


@dataclass(slots=True)
class NoParams:
    """This plugin takes no parameters."""


class Kind(enum.StrEnum):
    FILTER = "filter"
    SCORER = "scorer"
    PICKER = "picker"
    FLOW = "flow"  # flow control: ordering, fairness, shedding, working-set room, late binding, prefill gate
    DECIDER = "decider"  # prefill/decode disaggregation: whether a placed call's prompt runs elsewhere


class Plugin:
    """Base of every plugin. Subclasses set ``type_name`` and ``Params``."""

    kind: ClassVar[Kind]
    type_name: ClassVar[str] = ""
    Params: ClassVar[type] = NoParams

    def __init__(self, params: Any, *, name: str | None = None, weight: float = 1.0, policy: str = "custom") -> None:
        self.params = params
        self.name = name or self.type_name
        self.weight = float(weight)
        self.policy = policy

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, weight={self.weight}, params={self.params})"

    @property
    def kv_source(self) -> str | None:
        """The KV index source this plugin matches prompts against, if it reads the index
        (the pipeline then records its own routing where that source needs it)."""
        return None

    def bind(self, handle: Handle) -> None:
        """Called once when the pipeline is built, with the handle the plugin reads."""


class Filter(Plugin):
    kind = Kind.FILTER

    def __init__(self, params: Any, **kw: Any) -> None:
        super().__init__(params, **kw)
        self.filtered = FILTERED.labels(self.policy, self.name)

    def filter(self, state: CycleState) -> np.ndarray | None:
        """Boolean mask over ``state.sel`` (True = keep); None keeps every candidate."""
        raise NotImplementedError

    def keeps(self, one: OneCandidate) -> bool:
        """``filter`` for a forced choice (a pinned session's replica): does the filter keep
        it? This default asks ``filter`` over a pool of that one replica; the built-in
        filters override it with the same test in plain floats (on one candidate numpy's
        per-operation overhead is all of the cost)."""
        keep = self.filter(one.cycle_state())
        return keep is None or bool(keep[0])

    def releases_pin(self, one: OneCandidate) -> bool:
        """Should a pinned session's call be decided over the whole pool although ``keeps``
        keeps its replica (a judgement against the other replicas, which ``keeps`` cannot
        make over a pool of one)? Flow control asks only filters that override this."""
        return False


class Scorer(Plugin):
    kind = Kind.SCORER

    def __init__(self, params: Any, **kw: Any) -> None:
        super().__init__(params, **kw)
        self.hist = PLUGIN_SCORE.labels(self.policy, self.name)

    def score(self, state: CycleState) -> np.ndarray:
        """Scores in [0, 1] for the candidates ``state.sel`` (higher is better)."""
        raise NotImplementedError


class Picker(Plugin):
    kind = Kind.PICKER

    def pick(self, state: CycleState, totals: np.ndarray) -> int:
        """Position (into ``state.sel``) of the chosen candidate."""
        raise NotImplementedError


class Stateful:
    """A plugin that keeps state across decisions, told of each call's life by the pipeline.

    ``sessions``: a plugin that keeps session pins offers them here; the pipeline hands the
    first such view to every plugin (``Handle.sessions``)."""

    sessions: SessionsView | None = None

    def placed(self, state: CycleState | OneCandidate, view: ReplicaView, decision: Decision) -> None:
        """The pipeline placed ``state.request`` on ``view`` (may annotate ``decision``)."""

    def completed(self, request: CallRequest, outcome: CallOutcome, now_s: float) -> None:
        """A placed call ended."""

    def task_ended(self, session: str) -> None:
        """The task (or conversation) ``session`` reported its end: nothing more will come."""

    def replica_failed(self, replica: str) -> int:
        """A replica failed; returns how many of this plugin's entries it broke."""
        return 0

    def replica_removed(self, replica: str) -> None:
        """A replica left the pool for good."""
