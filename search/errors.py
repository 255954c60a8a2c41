"""A user's mistake (a bad path, config, device or study name): the command prints its one-line
message, which names the problem and the fix, and exits 2; `--debug` shows the traceback."""


class UserError(ValueError):
    """Bad input to a command; the message is one line: the problem and the fix."""
