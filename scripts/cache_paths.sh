# Sourced by the scripts (not run): where choreo keeps its cache, resolved as the binary resolves it
# (common/paths.cc): $XDG_CACHE_HOME/choreo when XDG_CACHE_HOME is set and not empty, else $HOME/.cache/choreo
# (/tmp/.cache/choreo without a HOME). Every script takes its cache paths from here, never spells them itself
# (tests/scripts_cache_test.cc checks both), so that a user whose cache lives elsewhere gets one cache.
#   CHOREO_CACHE          the cache directory
#   CHOREO_DEFAULT_MODEL  the model scripts/setup.sh installs there (choreo's default without -m or $CHOREO_MODEL)
#   CHOREO_VENV           the venv of the Python reference tools (kept when already set)
CHOREO_CACHE="${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/choreo"
CHOREO_DEFAULT_MODEL="$CHOREO_CACHE/models/SmolLM2-135M-Instruct.Q4_1.gguf"
CHOREO_VENV="${CHOREO_VENV:-$CHOREO_CACHE/venv}"
