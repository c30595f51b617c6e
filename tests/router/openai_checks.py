"""What every openai_*_test.py shares: a check log that records failures and keeps going, and the
reading of a response field the openai client does not model (our extensions such as `token_ids`).

The test scripts import it by name: run_openai_client_test.py runs them as files in this folder, so
Python puts this folder first on sys.path for the router.* and the cluster_e2e.* tests alike.
"""
import sys


class CheckLog:
    """check(cond, what) prints "ok"/"FAIL" per check and remembers the failures, so one script reports
    every broken check in a run rather than stopping at the first; exit() then decides the exit status."""

    def __init__(self):
        self.failures = []

    def __call__(self, cond, what):
        print(("ok   " if cond else "FAIL ") + what)
        if not cond:
            self.failures.append(what)

    def exit(self, all_passed="all checks passed"):
        """Exit 1 naming how many checks failed, else print `all_passed` and exit 0."""
        if self.failures:
            print(f"{len(self.failures)} failure(s)")
            sys.exit(1)
        print(all_passed)
        sys.exit(0)


def extra(obj, name):
    """The field `name` of a response object, also where the client keeps unknown fields (model_extra)."""
    v = getattr(obj, name, None)
    if v is None and getattr(obj, "model_extra", None):
        v = obj.model_extra.get(name)
    return v
