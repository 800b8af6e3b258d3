"""Pickers: choose one candidate from the scored ones."""

from taskplane.scheduler.pickers.basic import MaxScorePicker, RoundRobinPicker
from taskplane.scheduler.pickers.hashring import ConsistentHashPicker
from taskplane.scheduler.pickers.sglang import SglangCacheAwarePicker

__all__ = ["ConsistentHashPicker", "MaxScorePicker", "RoundRobinPicker", "SglangCacheAwarePicker"]
