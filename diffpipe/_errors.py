"""The two error types of diffpipe. Both are ``ValueError`` with a one-line message naming the culprit."""


class ScheduleError(ValueError):
    """A schedule (or a family's arguments) is malformed: the message names the op, device or option."""


class ConfigError(ValueError):
    """A hardware model, workload, knob or command-line option is malformed: the message names it."""
