"""Image input for Llama 4: content items, tiling, preprocessing (and, in ``workbench.models.vision``, the encoder).

``layout`` and ``images`` are torch-free (the chat format uses them to lay out image tokens);
``preprocess`` turns an image into normalized tile tensors with PIL and torch.
"""

from workbench.vision.images import is_image_item, open_image
from workbench.vision.layout import ImageLayout, image_layout

__all__ = ["ImageLayout", "image_layout", "is_image_item", "open_image"]
