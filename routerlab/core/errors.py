"""The one exception type RouterLab raises for bad input: a message that names the problem and the way out.

Knows nothing about models or the UI; the CLI and the app print `str(err)` instead of a traceback.
"""


class RouterLabError(ValueError):
    """Bad input or an unusable file. `str(err)` is a complete, user-facing sentence."""

    def __init__(self, problem: str, fix: str | None = None):
        self.problem = problem
        self.fix = fix
        super().__init__(problem if not fix else f"{problem} {fix}")
