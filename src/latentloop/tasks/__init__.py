"""Tasks: generators, loaders, encoders and verifiers (see ``base.Task``)."""

from latentloop.tasks.base import TASKS, Task, get_task, parse_task_spec

__all__ = ["TASKS", "Task", "get_task", "parse_task_spec"]
