"""The Python and NumPy random generators' states, as zcc.torch and
zcc.paddle checkpoint them (plain data, compact: they go into every
snapshot), read again only when they moved."""

import ctypes
import random
import struct
import sys

from zcc import _zcc


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


def numpy_rng_state(np=None):
    """NumPy's global (legacy) generator's state, None without NumPy."""
    np = np or sys.modules.get("numpy")
    if np is None:
        return None
    name, keys, pos, has_gauss, cached = np.random.get_state()
    return (name, keys.astype("<u4").tobytes(), int(pos), int(has_gauss), float(cached))


def set_numpy_rng_state(state):
    np = sys.modules.get("numpy")
    if np is None or state is None:
        return
    name, keys, pos, has_gauss, cached = state
    np.random.set_state((name, np.frombuffer(keys, dtype="<u4").astype(np.uint32), pos, has_gauss,
                         cached))


_MT_WORDS = 624


class GeneratorStates:
    """{"python_random": ..., "numpy_random": ...} for a snapshot.

    Reading both through their public APIs costs tens of microseconds at
    every snapshot, and most training steps draw from neither. Both are
    MT19937: Python's words and position lie right after the object header
    of random's hidden Random instance, NumPy's legacy generator's at its
    bit generator's ctypes.state_address. Where the bytes found there match
    the public state, a _zcc.MemoryWatch compares them at the next snapshot
    and the public APIs are read again only when they moved.

    What the words do not hold is checked apart: Python's cached Gaussian
    (gauss_next, an attribute), and which NumPy module and bit generator are
    current (np.random.set_bit_generator swaps it). NumPy's cached Gaussian
    lies outside the words, and its use (the second of a pair of legacy
    Gaussian draws) changes no word, so a state holding one is always read
    again; one can appear without a word moving only through set_state."""

    def __init__(self):
        self._watch = None
        self._state = None
        self._gauss = None  # Python's gauss_next in self._state
        self._np = None
        self._numpy_rand = None  # NumPy's global RandomState (bit generators swap inside it)
        self._bits = None  # its bit generator watched

    def state(self):
        np = sys.modules.get("numpy")
        if self._watch is not None and np is self._np and \
                random._inst.gauss_next == self._gauss and \
                (np is None or self._numpy_rand._bit_generator is self._bits) and \
                not self._watch.changed():
            return self._state
        return self._read(np)

    def _read(self, np):
        py_state = python_rng_state()
        np_state = numpy_rng_state(np)
        self._state = {"python_random": py_state, "numpy_random": np_state}
        self._gauss = py_state[2]
        self._np = np
        self._watch = None
        ranges = []
        if self._watchable_python(py_state, ranges) and self._watchable_numpy(np, np_state, ranges):
            self._watch = _zcc.MemoryWatch(ranges)
        return self._state

    @staticmethod
    def _watchable_python(state, ranges):
        inst = random._inst
        version, words, _ = state
        if type(inst) is not random.Random or not isinstance(words, bytes) or \
                len(words) != 4 * (_MT_WORDS + 1):
            return False
        # RandomObject: the header, int index, uint32_t state[624].
        address = id(inst) + object.__basicsize__
        raw = ctypes.string_at(address, 4 + 4 * _MT_WORDS)
        if raw[4:] != words[:-4] or raw[:4] != words[-4:]:
            return False
        ranges.append((inst, address, len(raw)))
        return True

    def _watchable_numpy(self, np, state, ranges):
        if np is None:
            return True
        rand = getattr(getattr(np.random, "mtrand", None), "_rand", None)
        bits = getattr(rand, "_bit_generator", None)
        if bits is None or state[0] != "MT19937" or state[3]:  # a cached Gaussian: read each time
            return False
        try:
            address = int(bits.ctypes.state_address)
        except Exception:  # not MT19937, or no ctypes: the public API alone
            return False
        # mt19937_state: uint32_t key[624]; int pos.
        raw = ctypes.string_at(address, 4 * _MT_WORDS + 4)
        if raw[:-4] != state[1] or int.from_bytes(raw[-4:], "little", signed=True) != state[2]:
            return False
        self._numpy_rand, self._bits = rand, bits
        ranges.append((bits, address, len(raw)))
        return True
