"""Engines that run packshard's work units: in this process, on local processes, or on Ray."""

from packshard.engine.base import ENGINES, Engine, EngineOptions, TaskFailed, open_engine

__all__ = ["ENGINES", "Engine", "EngineOptions", "TaskFailed", "open_engine"]
