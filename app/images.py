"""Image facts and thumbnails (Pillow): dimensions read from a file's first bytes, JPEG thumbnails made on demand."""

from __future__ import annotations

import io
import warnings

from PIL import Image, UnidentifiedImageError

from app import errors

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


def thumbnail(data: bytes, size: int = THUMBNAIL) -> bytes:
    """A JPEG no larger than `size` × `size`; `NotAnImage` if `data` is not a readable image, `ImageTooLarge` if
    decoding it would take more than `MAX_PIXELS` pixels (checked from its header, before decoding)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data)) as opened:
                opened.draft("RGB", (size, size))  # JPEG: decode at a reduced scale (the size it reports shrinks)
                _within_limit(*opened.size)
                opened.thumbnail((size, size))
                image: Image.Image = opened
                if image.mode not in ("RGB", "L"):  # flatten transparency onto white
                    rgba = image.convert("RGBA")
                    image = Image.new("RGB", image.size, "white")
                    image.paste(rgba, mask=rgba.getchannel("A"))
                out = io.BytesIO()
                image.save(out, "JPEG", quality=80)
    except Image.DecompressionBombError as exc:  # Pillow's own guard, at twice its `MAX_IMAGE_PIXELS`, on opening
        raise errors.ImageTooLarge(f"The image has too many pixels to decode: {exc}") from None
    except (UnidentifiedImageError, OSError, ValueError):
        raise errors.NotAnImage() from None
    return out.getvalue()


def _within_limit(width: int, height: int) -> None:
    if width * height > MAX_PIXELS:
        raise errors.ImageTooLarge(
            f"The image is {width} × {height} pixels: over the {MAX_PIXELS:,} pixels a thumbnail is made from.",
            width=width,
            height=height,
            limit=MAX_PIXELS,
        )
