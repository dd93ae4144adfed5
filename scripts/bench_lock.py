"""Taking turns on a shared machine. With $CHOREO_CPU_LOCK set to a lock file (e.g. /tmp/choreo-cpu.lock), every
measured run of the benchmark scripts holds an exclusive flock on it, so a build or another benchmark that takes
the same lock (`flock /tmp/choreo-cpu.lock ninja -C build`) runs between two measured runs, never during one.
Unset, runs take no lock (wrap the whole script in flock instead)."""
import contextlib
import fcntl
import os


@contextlib.contextmanager
def machine_turn():
    path = os.environ.get("CHOREO_CPU_LOCK")
    if not path:
        yield
        return
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
