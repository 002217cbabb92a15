"""Offline install bundles for air-gapped GPU hosts.

``python -m nvfp4stack.bundle build``: resolve vLLM and what it needs for the target's Python and
platform, leave out what the target already has, download the wheels and write numbered chunk
folders (``chunk-000``, ...) no larger than a chosen size, with a manifest of sha256 per wheel, per
part and per chunk. ``bash install.sh --offline DIR`` (``install.py``, standard library only)
verifies, reassembles and installs them with ``pip --no-index --no-deps``.
"""
