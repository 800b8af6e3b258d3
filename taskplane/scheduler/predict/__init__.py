"""What the decisions use about the future, learned online from history.

Steps left, whether this is a session's last turn, how long a tool gap lasts, how many
tokens a call will generate and how much work a task has left: each comes from a model
learned per agent, tool and tenant from the calls and task ends seen (the live stream, or
history loaded at start-up), combined with the SDK's hints where an author gave them. Each
answer is a :class:`Prediction` with a confidence in 0..1; a decision that needs more
confidence than a prediction has falls back to what it would do with no context.

Pure: no clock, no I/O; callers pass the time and the observations.
"""

from taskplane.scheduler.predict.base import Prediction, Running, evidence
from taskplane.scheduler.predict.gaps import GapModel
from taskplane.scheduler.predict.model import Predictor, TaskHistory
from taskplane.scheduler.predict.outputs import OutputModel
from taskplane.scheduler.predict.steps import StepsModel

__all__ = ["GapModel", "OutputModel", "Prediction", "Predictor", "Running", "StepsModel", "TaskHistory", "evidence"]
