"""Files that tests upload: a gzip that inflates far beyond its size."""

import zlib


def inflating_gzip(pattern: bytes, inflated: int) -> bytes:
    """A gzip of `pattern` repeated to `inflated` bytes, built without holding the text."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, 31)  # 31: a gzip header and trailer
    block = pattern * (2**20 // len(pattern))
    parts = [compressor.compress(block) for _ in range(inflated // len(block))]
    return b"".join([*parts, compressor.flush()])
