"""The case runner the command-line test scripts share: @case runs a function at once and
prints "ok   name" or "FAIL name" (the assertion's message on stderr), the lines
scripts/count_tests.py counts; finish() exits non-zero when a case failed."""
import sys

failed = 0


def case(fn):
    global failed
    try:
        fn()
        print(f"ok   {fn.__name__}")
    except AssertionError as e:
        failed += 1
        print(f"FAIL {fn.__name__}")
        print(f"  {e}", file=sys.stderr)
    return fn


def finish(what=None):
    if what:
        print(f"{failed} {what} case(s) failed" if failed else f"all {what} cases passed")
    sys.exit(1 if failed else 0)
