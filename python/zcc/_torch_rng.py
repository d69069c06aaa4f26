"""torch's CPU generator state as zcc.torch snapshots it at every step:
torch.get_rng_state() (a 5056-byte tensor made afresh, 30-40 us of a
step() call after the step's compute) is called again only when the
generator's memory moved, as zcc._rng_state does for Python's and NumPy's."""

import ctypes
import os
import struct

import torch

from zcc import _zcc

# torch.get_rng_state()'s bytes (ATen's CPUGeneratorImplState): the legacy
# record (initial seed u64, left i32, seeded i32, next u64, the 624 words of
# the Mersenne Twister each as a u64, normal_x/y/rho f64, normal_is_valid
# i32, padding), then the cached float normal (f32) and its flag (bool).
_STATE_BYTES = 5056
_WORDS = 624
_WORDS_AT = 24
_NORMAL_Y_AT = 5024
_NORMAL_VALID_AT = 5040
_FLOAT_AT = 5048
_FLOAT_VALID_AT = 5052

# The generator object (CPUGeneratorImpl) holds, after its base: the engine
# (seed u64, left i32, seeded bool, next u32, the 624 words as u32: 2520
# bytes with padding), then std::optional<float> and std::optional<double>,
# the cached normals. Every draw moves `left` and `next` (or the words), and
# seeding or set_rng_state writes all of it, so nothing changes the state
# without changing these bytes.
_ENGINE_BYTES = 2520
_WATCHED_BYTES = _ENGINE_BYTES + 8 + 16
_HEAD = struct.Struct("<QiBxxxI")  # seed, left, seeded, next
# How far into the object the engine may start (its base is a vtable,
# counts, a device, a key set, a PyObject pointer and a mutex).
_SEARCH_BYTES = 256


def _engine_range(state):
    """(address, bytes) of the default generator's engine and cached
    normals when its memory holds exactly `state` (torch.get_rng_state()'s
    bytes) where expected; None when anything differs (another torch whose
    layout this does not know: the public API is then read every step)."""
    gen = torch.default_generator
    if len(state) != _STATE_BYTES or type(gen).__basicsize__ < object.__basicsize__ + 8:
        return None
    # THPGenerator: the object header, then at::Generator, one pointer to
    # the CPUGeneratorImpl.
    impl = ctypes.c_void_p.from_address(id(gen) + object.__basicsize__).value
    window = _read_memory(impl, _SEARCH_BYTES + _WATCHED_BYTES) if impl else None
    if window is None:
        return None
    seed, left, seeded, next_ = struct.unpack_from("<QiiQ", state, 0)
    words = struct.unpack_from("<%dQ" % _WORDS, state, _WORDS_AT)
    if next_ > 0xFFFFFFFF or seeded not in (0, 1) or max(words) > 0xFFFFFFFF:
        return None
    head = _HEAD.pack(seed, left, seeded, next_)
    packed_words = struct.pack("<%dI" % _WORDS, *words)
    for at in range(8, _SEARCH_BYTES, 8):
        if window[at:at + 8] != head[:8]:
            continue
        raw = window[at:at + _WATCHED_BYTES]
        if raw[8:13] != head[8:13] or raw[16:20] != head[16:20] or \
                raw[_HEAD.size:_HEAD.size + len(packed_words)] != packed_words:
            continue
        if not _normals_match(raw[_ENGINE_BYTES:], state):
            return None
        return impl + at, _WATCHED_BYTES
    return None


def _read_memory(address, length):
    """`length` bytes of this process's memory at `address`, read through
    /proc/self/mem (which fails, where a pointer read would crash, when the
    address is not what the layout above says); None when it cannot be."""
    try:
        fd = os.open("/proc/self/mem", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        data = os.pread(fd, length, address)
    except (OSError, OverflowError, ValueError):
        return None
    finally:
        os.close(fd)
    return data if len(data) == length else None


def _normals_match(raw, state):
    """Whether the cached normals in the generator's memory (optional<float>,
    optional<double>) are the ones `state` holds."""
    float_value, float_set = struct.unpack_from("<fB", raw, 0)
    double_value, double_set = struct.unpack_from("<dB", raw, 8)
    want_float_set = state[_FLOAT_VALID_AT]
    want_double_set = struct.unpack_from("<i", state, _NORMAL_VALID_AT)[0]
    if float_set != bool(want_float_set) or double_set != bool(want_double_set):
        return False
    if float_set and raw[0:4] != state[_FLOAT_AT:_FLOAT_AT + 4]:
        return False
    if double_set and raw[8:16] != state[_NORMAL_Y_AT:_NORMAL_Y_AT + 8]:
        return False
    return True


class CpuGeneratorState:
    """Copies torch's default CPU generator's state into a uint8 tensor,
    reading it through the public API only when the generator moved since
    the last copy (the check: one memcmp of 2.5 KB). torch draws without
    the GIL, so another thread may move the generator at any time: a copy
    counts only when the generator's memory held still across the read."""

    _READS = 4  # tries for a read the memory held still across
    _SEARCHES = 3  # tries to find the engine before giving up on watching

    def __init__(self):
        self._watch = None
        self._settled = False  # the last copy is what the watch last saw
        self._searches_left = self._SEARCHES

    def forget(self):
        """The next copy_into reads the generator whatever the watch says
        (call it when anything else wrote the tensor, as a restore does)."""
        self._settled = False

    def copy_into(self, out):
        """`out` (a uint8 tensor of torch.get_rng_state()'s size) holds the
        generator's state after the call."""
        watch = self._watch
        if watch is None and self._searches_left > 0:
            watch = self._start_watching()
        if watch is None:
            out.copy_(torch.get_rng_state())
            return
        if self._settled and not watch.changed():
            return
        # changed() leaves the watch holding the memory as it was then: a
        # read followed by no change since is that memory's state.
        for _ in range(self._READS):
            state = torch.get_rng_state()
            if not watch.changed():
                out.copy_(state)
                self._settled = True
                return
        out.copy_(state)  # moving all along (another thread): read again next time
        self._settled = False

    def _start_watching(self):
        """The watch (its view: the memory now), or None."""
        self._searches_left -= 1
        found = _engine_range(torch.get_rng_state().numpy().tobytes())
        if found is None:
            return None  # (a draw between the read and the search, or another layout)
        address, length = found
        self._watch = _zcc.MemoryWatch([(torch.default_generator, address, length)])
        self._settled = False
        return self._watch


class CudaGeneratorStates:
    """The CUDA generators' states as torch.cuda.get_rng_state_all() gives
    them (one bytes object per device), without its per-device Python and
    fresh tensors at every step. A CUDA generator's state is its seed and
    its Philox offset (CUDAGeneratorImpl: seed u64, then offset i64), both
    readable without a tensor: their packing is checked once per device
    against get_state(); a device whose bytes differ (another layout), or a
    torch without Generator.get_offset, is read through the public API."""

    _STATE = struct.Struct("<Qq")

    def __init__(self):
        self._packed = {}  # device index -> whether seed + offset packing is its state

    def states(self):
        """[bytes] per CUDA device, as get_rng_state_all() would give."""
        generators = torch.cuda.default_generators
        out = []
        for index, gen in enumerate(generators):
            packed = self._packed.get(index)
            if packed is None:
                packed = self._packed[index] = self._packing_holds(gen)
            if packed:
                out.append(self._STATE.pack(gen.initial_seed(), gen.get_offset()))
            else:
                out.append(gen.get_state().numpy().tobytes())
        return out

    def _packing_holds(self, gen):
        if not hasattr(gen, "get_offset"):
            return False
        try:
            return self._STATE.pack(gen.initial_seed(), gen.get_offset()) == \
                gen.get_state().numpy().tobytes()
        except (RuntimeError, struct.error, OverflowError):
            return False

