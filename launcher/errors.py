"""One error type for everything a user can fix, caught once at the CLI edge."""

from __future__ import annotations


class LaunchError(Exception):
    """A problem the user can fix: names the value, why it is wrong, and the fix.

    `problems` is a list of (what, why, fix) so several mistakes are reported
    at once; the CLI prints them as a numbered list and exits with status 2.
    """

    def __init__(self, problems):
        if isinstance(problems, tuple) and len(problems) == 3 and all(isinstance(p, str) for p in problems):
            problems = [problems]
        self.problems = list(problems)
        super().__init__(self.render())

    def __reduce__(self):  # pickled as its problems (a child process's error: launcher.models._in_a_child)
        return (type(self), (self.problems,))

    def render(self) -> str:
        if len(self.problems) == 1:
            what, why, fix = self.problems[0]
            return f"error: {what}: {why}\n  fix: {fix}"
        lines = [f"error: {len(self.problems)} problems in the configuration:"]
        for i, (what, why, fix) in enumerate(self.problems, 1):
            lines.append(f"  {i}. {what}: {why}\n     fix: {fix}")
        return "\n".join(lines)
