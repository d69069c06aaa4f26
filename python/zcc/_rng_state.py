"""The Python and NumPy random generators' states, as zcc.torch checkpoints
them (plain data, compact: they go into every snapshot)."""

import ctypes
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


class _NumpyRng:
    """NumPy's global generator state, read again only when it moved.

    np.random.get_state() costs about 30 us (its state property builds an
    array), paid at every snapshot. The legacy generator's MT19937 state (624
    words and a position) lies at the bit generator's ctypes.state_address;
    while those bytes are unchanged, so is the state (a Gaussian cached by a
    legacy draw changes them too), and the last state read is returned.
    The fast path is used only where the bytes at that address were checked
    to match get_state(); the bit generator read from is held, so its memory
    stays valid, and one swapped in (np.random.set_bit_generator) is checked
    again."""

    _MT_BYTES = 624 * 4 + 4

    def __init__(self):
        self._generator = None  # the bit generator whose state is watched
        self._address = None
        self._raw = None
        self._state = None

    def state(self, np):
        generator = getattr(np.random.mtrand, "_rand", None)
        bits = getattr(generator, "_bit_generator", None)
        if bits is None:  # another NumPy: the public API alone
            return self._read(np)
        if bits is not self._generator:
            self._watch(np, bits)
        if self._address is None:
            return self._read(np)
        raw = ctypes.string_at(self._address, self._MT_BYTES)
        if raw != self._raw:
            self._raw = raw
            self._state = self._read(np)
        return self._state

    def _watch(self, np, bits):
        self._generator, self._address, self._raw = bits, None, None
        try:
            address = int(bits.ctypes.state_address)
        except Exception:  # not MT19937, or no ctypes: the public API alone
            return
        state = self._read(np)
        raw = ctypes.string_at(address, self._MT_BYTES)
        if state[0] == "MT19937" and raw[:-4] == state[1] and \
                int.from_bytes(raw[-4:], "little", signed=True) == state[2]:
            self._address, self._raw, self._state = address, raw, state

    @staticmethod
    def _read(np):
        name, keys, pos, has_gauss, cached = np.random.get_state()
        return (name, keys.astype("<u4").tobytes(), int(pos), int(has_gauss), float(cached))


_numpy_rng = _NumpyRng()


def numpy_rng_state():
    np = sys.modules.get("numpy")
    if np is None:
        return None
    return _numpy_rng.state(np)


def set_numpy_rng_state(state):
    np = sys.modules.get("numpy")
    if np is None or state is None:
        return
    name, keys, pos, has_gauss, cached = state
    np.random.set_state((name, np.frombuffer(keys, dtype="<u4").astype(np.uint32), pos, has_gauss,
                         cached))
