"""Runs every tests/python/test_*.py's main() in this one process, so
numpy and torch are imported once (seconds each on a loaded host) and each
test's forked ranks inherit them. Exit status: the number of failed tests.
Arguments: names to run (default: all); a test_ddp* test needs torch."""
import glob
import importlib
import importlib.util
import os
import sys
import time
import traceback

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
names = sys.argv[1:] or sorted(os.path.basename(p)[:-3]
                               for p in glob.glob(os.path.join(here, "test_*.py")))
has_torch = importlib.util.find_spec("torch") is not None
failed = []
for name in names:
    if name.startswith("test_ddp") and not has_torch:
        print("%s: SKIP (no torch)" % name, flush=True)
        continue
    start = time.monotonic()
    try:
        importlib.import_module(name).main()
        print("%s: ok (%.1f s)" % (name, time.monotonic() - start), flush=True)
    except BaseException:  # noqa: BLE001 - report and go on with the next test
        traceback.print_exc()
        print("FAIL: %s (%.1f s)" % (name, time.monotonic() - start), flush=True)
        failed.append(name)
sys.exit(len(failed))
