"""The Python and NumPy random generators' states, as zcc.torch checkpoints
them (plain data, compact: they go into every snapshot)."""

import random
import struct
import sys


def python_rng_state():
    """random.getstate() with its 625 words as little-endian bytes: a third of
    the time to pickle (every snapshot carries it) and one check, not 625."""
    version, words, gauss = random.getstate()
    try:
        return (version, struct.pack("<%dI" % len(words), *words), gauss)
    except struct.error:  # not 32-bit words: kept as they are
        return (version, words, gauss)


def set_python_rng_state(state):
    version, words, gauss = state
    if isinstance(words, bytes):  # (older checkpoints hold the tuple itself)
        words = struct.unpack("<%dI" % (len(words) // 4), words)
    random.setstate((version, tuple(words), gauss))


def numpy_rng_state():
    np = sys.modules.get("numpy")
    if np is None:
        return None
    name, keys, pos, has_gauss, cached = np.random.get_state()
    return (name, keys.tobytes(), int(pos), int(has_gauss), float(cached))


def set_numpy_rng_state(state):
    np = sys.modules.get("numpy")
    if np is None or state is None:
        return
    name, keys, pos, has_gauss, cached = state
    np.random.set_state((name, np.frombuffer(keys, dtype=np.uint32).copy(), pos, has_gauss, cached))
