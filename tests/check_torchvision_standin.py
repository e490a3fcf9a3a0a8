# ruff: noqa: E402
"""Cross-check of tests/torchvision_standin.py against the real torchvision 0.28.0 transforms code (run by hand).

The torchvision 0.28.0 wheel cannot be imported with the CPU torch (its compiled ops fail to register), but
its transforms are plain Python.  This script unpacks only ``torchvision/transforms`` from the wheel into a
temporary folder, imports it under a bare ``torchvision`` package (no ``__init__``, no extension), and
compares every stand-in transform with the real one on PIL images and tensors.  Usage::

    pip download --no-deps torchvision==0.28.0 -d /tmp/tv   # or any local copy of the wheel
    PYTHONPATH=. python tests/check_torchvision_standin.py /tmp/tv/torchvision-0.28.0-*.whl

Last run 2026-11-30: "stand-in == torchvision 0.28.0 python code on 284 cases".
"""

import glob
import sys
import tempfile
import zipfile

wheel = glob.glob(sys.argv[1])[0]
root = tempfile.mkdtemp()
with zipfile.ZipFile(wheel) as zf:
    zf.extractall(root, [n for n in zf.namelist() if n.startswith("torchvision/transforms/")])
import types

import torch

pkg = types.ModuleType("torchvision")
pkg.__path__ = [root + "/torchvision"]
sys.modules["torchvision"] = pkg
utils = types.ModuleType("torchvision.utils")
utils._log_api_usage_once = lambda *a, **k: None
utils._Image_fromarray = None
sys.modules["torchvision.utils"] = utils
import torchvision.transforms as real
import torchvision.transforms.functional as realF

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import torchvision_standin as st
from test_vision_preprocess import pattern_image

n = 0
for w, h in [(50, 30), (300, 120), (7, 900), (448, 448)]:
    img = pattern_image(w, h)
    for size in [(12, 20), (h, w), (448, 448), (1, 3), 15, [33]]:
        a = real.Resize(size)(img)
        b = st.Resize(size)(img)
        assert a.size == b.size and a.tobytes() == b.tobytes()
        n += 1
        a = realF.resize(img, size, interpolation=real.InterpolationMode.BILINEAR)
        b = st.resize(img, size, interpolation=st.InterpolationMode.BILINEAR)
        assert a.tobytes() == b.tobytes()
        n += 1
        for t in [torch.rand(3, h, w), (torch.rand(3, h, w) * 255).to(torch.uint8), torch.rand(2, 3, h, w)]:
            for aa in (True, False, None):
                x = real.Resize(size, antialias=aa)(t)
                y = st.Resize(size, antialias=aa)(t)
                assert x.dtype == y.dtype and torch.equal(x, y)
                n += 1
    for mode in ("RGB", "L", "RGBA"):
        im = img.convert(mode)
        x = real.ToTensor()(im)
        y = st.ToTensor()(im)
        assert torch.equal(x, y)
        n += 1
    x = real.ToTensor()(img)
    a = real.Normalize((0.5,) * 3, (0.5,) * 3, inplace=True)(x.clone())
    b = st.Normalize((0.5,) * 3, (0.5,) * 3, inplace=True)(x.clone())
    assert torch.equal(a, b)
    n += 1
    c = real.Compose([real.Resize((56, 56)), real.ToTensor(), real.Normalize((0.5,) * 3, (0.5,) * 3)])(img)
    d = st.Compose([st.Resize((56, 56)), st.ToTensor(), st.Normalize((0.5,) * 3, (0.5,) * 3)])(img)
    assert torch.equal(c, d)
    n += 1
print("stand-in == torchvision 0.28.0 python code on", n, "cases")
