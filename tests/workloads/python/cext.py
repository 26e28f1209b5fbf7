"""cext.py: Python callers of C extensions, for checking that the native frames of zlib and of
the SHA-256 code (OpenSSL's libcrypto or CPython's own _sha256/_sha2) stay below their Python
caller in a stack (CPython 3.6 to 3.14).

    <module> -> compress_loop -> zlib.compress (native: deflate ...)
             -> hash_loop     -> hashlib.sha256 (native: EVP_Digest..., sha256_...)

Usage: cext.py SECONDS. Prints {"ready":true,"pid":N} at start and exits after SECONDS.
"""
import hashlib
import json
import os
import random
import sys
import time
import zlib


def compress_loop(data):
    return len(zlib.compress(data, 9))


def hash_loop(data):
    # About as long as one zlib.compress of the same buffer (SHA-256 is ~25x faster than
    # deflate at level 9 here), so both get a good share of the samples.
    digest = b""
    for _ in range(200):
        digest = hashlib.sha256(data).digest()
    return digest


seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 10.0
rng = random.Random(7)
# 1 MiB that compresses (runs of a small alphabet): deflate works hard on it.
data = bytes(rng.choice(b"abcdefgh") for _ in range(1 << 16)) * 16
print(json.dumps({"ready": True, "pid": os.getpid()}), flush=True)
deadline = time.time() + seconds
while time.time() < deadline:
    compress_loop(data)
    hash_loop(data)
