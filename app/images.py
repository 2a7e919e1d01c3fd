"""Image facts and thumbnails (Pillow): dimensions read from a file's first bytes, JPEG thumbnails made on demand."""

from __future__ import annotations

import io
import warnings

from PIL import Image, UnidentifiedImageError

THUMBNAIL = 256  # pixels, the longer side
MAX_PIXELS = 40_000_000  # larger images are not decoded (decompression bombs)


def is_image(mime_type: str | None) -> bool:
    return bool(mime_type) and str(mime_type).lower().startswith("image/") and "svg" not in str(mime_type).lower()


def dimensions(head: bytes) -> tuple[int, int] | None:
    """Width and height from the start of an image file (headers only), or None if it is not one we can read."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(head)) as image:
                width, height = image.size
    except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError):
        return None
    return int(width), int(height)


def thumbnail(data: bytes, size: int = THUMBNAIL) -> bytes | None:
    """A JPEG no larger than `size` × `size`, or None if `data` is not a readable image (or is too large)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data)) as opened:
                if opened.size[0] * opened.size[1] > MAX_PIXELS:
                    return None
                opened.draft("RGB", (size, size))  # JPEG: decode at a reduced scale
                opened.thumbnail((size, size))
                image: Image.Image = opened
                if image.mode not in ("RGB", "L"):  # flatten transparency onto white
                    rgba = image.convert("RGBA")
                    image = Image.new("RGB", image.size, "white")
                    image.paste(rgba, mask=rgba.getchannel("A"))
                out = io.BytesIO()
                image.save(out, "JPEG", quality=80)
    except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError):
        return None
    return out.getvalue()
