"""The device path (``--augment-on device``): training images decoded and augmented on the training device.

The loader's workers make each sample's random draws and labels as the CPU path does and send a recipe; the
training process makes the pixels. What lives where, in the order a batch meets it:

- ``recipes.py``: a training sample as its draws and labels without pixels, and a batch of them with its
  files' bytes (made in the workers);
- ``prefetch.py``: :class:`DevicePrefetcher` and its loader thread, which takes the loader's batches a step or
  two ahead and makes them ready on the device (the transfer, the decode and the render);
- ``render.py``: :class:`Renderer`, a batch of recipes made into images: the decode, the resize, the render;
  where the images are made (``--augment-on``) and the one line that says so;
- ``decode.py``: JPEGs decoded in batches on the device, guarded against writing into memory queued work reads;
- ``plan.py``: the tables a batch's render reads, made on the host and copied in one transfer;
- ``kernels.py``: the resize and the render, each one compiled kernel, written once in tensor operations;
- ``compiled.py``: those kernels made ready beside the run (the uncompiled form serves until they are, and wherever
  one fails); ``kernel_cache.py``: where the compiled kernels are kept, once per machine, and how they run;
  ``kernel_compile.py``: the compile, in a process of its own;
- ``reference.py``: the same images said slowly in another form, the oracle the tests compare with.
"""

from .prefetch import DevicePrefetcher, LoaderThread, images_to_float, to_device_batch
from .render import Renderer, augment_choice, augment_place, render_batch, renderer_for

__all__ = [
    "DevicePrefetcher",
    "LoaderThread",
    "Renderer",
    "augment_choice",
    "augment_place",
    "images_to_float",
    "render_batch",
    "renderer_for",
    "to_device_batch",
]
