"""Fake CUDA on a CPU-only torch build: the GPU code paths run on ``FakeTensorMode`` tensors of device ``cuda``.

A fake tensor has a device, a dtype and a shape but no values; every op runs its meta kernel, which checks
what a CUDA kernel would (shapes, dtypes) and raises ``FakeTensorDeviceMismatchError`` when a CPU tensor meets
a CUDA one — the bug class a CPU-only CI otherwise never sees.  :func:`fake_cuda` sets up what torch leaves
out on a CPU-only build, and nothing else:

* **A CUDA device guard.**  Python indexing (``t[0]``, ``t[rows, :, pos] = v``) takes a device guard, and a
  CPU-only build registers none for CUDA ("PyTorch is not linked with support for cuda devices").  torch's
  own answer for "CUDA build, no GPU" is ``torch._C._ensureCUDADeviceGuardSet()``, which swaps in its no-op
  ``FakeGuardImpl<CUDA>`` when the registered CUDA guard reports zero devices; on a CPU-only build the slot
  is empty, so that function does nothing.  :func:`install_cuda_device_guard` puts a stand-in that reports
  zero devices into the slot, lets torch swap in its own guard, and empties the slot again on exit.
* **The device queries** the production code asks: ``torch.cuda.is_available`` (True),
  ``get_device_capability`` (the card's, default an H100's (9, 0)), ``device_count``, ``mem_get_info``.
* **Stand-in host values.**  Reading a fake tensor on the host (``.tolist()``, ``int(t)``, ``bool(t)``) has
  no value to return; :class:`StandInFakeMode` returns True / 0 / 0.0 (every sampled token is id 0),
  ``allclose`` and ``equal`` are True (the kernel self-tests compare a GPU kernel with the portable path:
  no values to compare, so they pass when they run without error), and ``bincount`` spreads its rows evenly
  over the bins (the MoE expert counts the per-expert loop reads on the host).
* **Two FakeTensorMode gaps of torch 2.13**: ``Module.to()`` swaps fake parameters, which fails while the
  fake-tensor memo holds a weak reference to them (the swap evicts those entries first); and a one-element
  constant moved to ``cuda`` with ``Tensor.to`` is constant-folded on the real (absent) device (the move runs
  on the fake tensor instead, as torch already does for ``_to_copy``).

Values are never checked here (the CPU tests check them); devices, dtypes and shapes are.
"""

from __future__ import annotations

import contextlib
import ctypes
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

from workbench.quantization import fp8, int4

aten = torch.ops.aten

_CUDA = 1  # c10::DeviceType::CUDA
_REGISTRY_SYMBOL = "_ZN3c104impl26device_guard_impl_registryE"  # c10::impl::device_guard_impl_registry
_GIB = 1 << 30
# Tensor.to overloads that can move a tensor to another device
_MOVES = (aten.to.device, aten.to.dtype_layout, aten.to.other)


def _guard_registry() -> Any:
    """c10's array of device guard implementations, one pointer per device type (CPU, CUDA, ...)."""
    libc10 = Path(torch.__file__).parent / "lib" / "libc10.so"
    try:
        head = ctypes.c_void_p.in_dll(ctypes.CDLL(str(libc10)), _REGISTRY_SYMBOL)
    except (OSError, ValueError) as exc:
        raise RuntimeError(
            f"torch {torch.__version__}: cannot find c10's device guard registry in {libc10} ({exc}); "
            "tests/_fake_cuda.py needs updating for this torch"
        ) from exc
    return (ctypes.c_void_p * (_CUDA + 1)).from_address(ctypes.addressof(head))


@contextlib.contextmanager
def install_cuda_device_guard() -> Iterator[None]:
    """Register torch's own no-op CUDA device guard for the duration (see the module docstring)."""
    registry = _guard_registry()
    if registry[_CUDA]:  # a CUDA build: torch registers a guard itself (FakeTensorMode swaps it when no GPU)
        yield
        return
    # A C++ object whose every virtual method returns 0: torch calls only deviceCount() on it, sees no
    # device, and stores its FakeGuardImpl<CUDA> in the slot instead.  No vtable offset is assumed.
    zero = ctypes.CFUNCTYPE(ctypes.c_int8, ctypes.c_void_p)(lambda this: 0)
    vtable = (ctypes.c_void_p * 64)(*([ctypes.cast(zero, ctypes.c_void_p).value] * 64))
    stand_in = (ctypes.c_void_p * 1)(ctypes.addressof(vtable))
    registry[_CUDA] = ctypes.addressof(stand_in)
    torch._C._ensureCUDADeviceGuardSet()
    if registry[_CUDA] == ctypes.addressof(stand_in):
        registry[_CUDA] = None
        raise RuntimeError(
            f"torch {torch.__version__} did not install its CUDA FakeGuardImpl; "
            "tests/_fake_cuda.py needs updating for this torch"
        )
    try:
        yield
    finally:
        registry[_CUDA] = None


def _even_counts(rows: int, bins: int) -> torch.Tensor:
    """``rows`` spread over ``bins`` as evenly as possible: a routing that gives every expert work."""
    return torch.tensor([rows // bins + (b < rows % bins) for b in range(bins)], dtype=torch.int64)


class StandInFakeMode(FakeTensorMode):
    """FakeTensorMode with stand-in values for host reads (see the module docstring)."""

    @property
    def avoid_device_init(self) -> bool:  # torch.cuda.is_available() is patched True: never touch the device
        return True

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func is aten._local_scalar_dense.default:
            tensor = args[0]
            if tensor.constant is not None:
                return tensor.constant.item()
            return True if tensor.dtype == torch.bool else 0.0 if tensor.is_floating_point() else 0
        if func in (aten.allclose.default, aten.equal.default):
            return True
        if func is aten.bincount.default:
            ids = args[0]
            bins = kwargs.get("minlength", args[2] if len(args) > 2 else 0)
            empty = torch.empty(bins, dtype=torch.int64, device="meta")
            return FakeTensor(self, empty, ids.device, constant=_even_counts(ids.numel(), bins))
        if func in _MOVES:
            hidden = [a for a in args if isinstance(a, FakeTensor) and a.constant is not None]
            constants = [a.constant for a in hidden]
            for a in hidden:
                a.constant = None
            try:
                return super().__torch_dispatch__(func, types, args, kwargs)
            finally:
                for a, constant in zip(hidden, constants):
                    a.constant = constant
        return super().__torch_dispatch__(func, types, args, kwargs)


_swap_tensors = torch.utils.swap_tensors


def _forget_weak_memos(tensor: torch.Tensor) -> None:
    """Drop the fake-tensor memo entries (WeakValueDictionary values) that hold ``tensor`` weakly."""
    for ref in weakref.getweakrefs(tensor):
        callback = getattr(ref, "__callback__", None)
        owners = [d for d in (getattr(callback, "__defaults__", None) or ()) if isinstance(d, weakref.ref)]
        for owner_ref in owners:
            owner = owner_ref()
            if isinstance(owner, weakref.WeakValueDictionary) and owner.get(ref.key) is tensor:
                del owner[ref.key]


def _swap_fake_tensors(t1: torch.Tensor, t2: torch.Tensor) -> None:
    _forget_weak_memos(t1)
    _forget_weak_memos(t2)
    _swap_tensors(t1, t2)


def _clear_kernel_choices() -> None:
    """The fp8/int4 self-tests are cached per device name: run them afresh under (and after) fake CUDA."""
    for cached in (fp8.storage_supported, fp8.scaled_mm_works, int4._kernel_for):
        cached.cache_clear()


@contextlib.contextmanager
def fake_cuda(capability: tuple[int, int] = (9, 0), memory_gib: int = 80) -> Iterator[StandInFakeMode]:
    """A CUDA card of compute ``capability`` as torch and workbench see it; yields the (not yet entered) mode.

    Settings are resolved inside the context (``device="cuda"`` checks ``torch.cuda.is_available()``); tensors
    are fake only inside ``with mode:``.
    """
    mode = StandInFakeMode()
    with contextlib.ExitStack() as stack:
        stack.enter_context(install_cuda_device_guard())
        patches = {
            "torch.cuda.is_available": lambda: True,
            "torch.cuda.device_count": lambda: 1,
            "torch.cuda.get_device_capability": lambda device=None: capability,
            "torch.cuda.mem_get_info": lambda device=None: (memory_gib * _GIB, memory_gib * _GIB),
            "torch.cuda.synchronize": lambda device=None: None,
            "torch.utils.swap_tensors": _swap_fake_tensors,
        }
        for target, stand_in in patches.items():
            stack.enter_context(mock.patch(target, stand_in))
        _clear_kernel_choices()
        stack.callback(_clear_kernel_choices)
        yield mode
