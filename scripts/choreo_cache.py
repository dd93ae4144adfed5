"""Where choreo keeps its cache, for the Python scripts: resolved as the binary (common/paths.cc) and
scripts/cache_paths.sh resolve it, $XDG_CACHE_HOME/choreo when XDG_CACHE_HOME is set and not empty, else
$HOME/.cache/choreo (/tmp/.cache/choreo without a HOME). Scripts import CACHE and DEFAULT_MODEL from here
rather than spelling the path (tests/scripts_cache_test.cc checks both)."""
import os


def cache_dir():
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg:
        return os.path.join(xdg, "choreo")
    return os.path.join(os.environ.get("HOME") or "/tmp", ".cache", "choreo")


CACHE = cache_dir()
DEFAULT_MODEL = os.path.join(CACHE, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")

if __name__ == "__main__":
    print(CACHE)
    print(DEFAULT_MODEL)
