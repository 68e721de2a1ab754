"""One self-describing checkpoint format for label and image checkpoints.

A checkpoint is a single safetensors file: tensors in the body, metadata as JSON
strings in the header. Loading never unpickles anything, checks the format
marker, the kind (``labels`` or ``model``) and the content hash, and turns a
truncated or foreign file into a :class:`CheckpointError` with one clear line.

Header metadata keys (all strings):

``format``     ``"hypsearch"``
``version``    format version (``FORMAT_VERSION``)
``kind``       ``"labels"`` or ``"model"``
``meta``       JSON object: everything that is not a tensor (config, metrics, …)
``sha256``     hash of the tensors and ``meta``, the checkpoint's version id
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from .fileio import atomic_write_bytes, read_named_file  # atomic_write_bytes re-exported

FORMAT = "hypsearch"
FORMAT_VERSION = "1"


class CheckpointError(ValueError):
    """A checkpoint file that is missing, truncated, foreign or of the wrong kind."""


def _digest(tensors: Mapping[str, torch.Tensor], meta_json: str) -> str:
    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].detach().cpu().contiguous()
        h.update(name.encode())
        h.update(str(t.dtype).encode())
        h.update(str(tuple(t.shape)).encode())
        # reshape(-1): a channels-last 1x1 kernel counts as contiguous with stride(-1) != 1
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    h.update(meta_json.encode())
    return h.hexdigest()


def encode_strings(strings: list[str]) -> torch.Tensor:
    """Pack a list of strings into one uint8 tensor (UTF-8, newline separated)."""
    for s in strings:
        if "\n" in s:
            raise ValueError(f"string {s!r} contains a newline and cannot be stored")
    data = "\n".join(strings).encode("utf-8")
    return torch.from_numpy(np.frombuffer(data, dtype=np.uint8).copy())


def decode_strings(t: torch.Tensor) -> list[str]:
    data = t.numpy().tobytes().decode("utf-8")
    return data.split("\n") if data else []


def save_checkpoint(
    path: str | os.PathLike,
    kind: str,
    tensors: Mapping[str, torch.Tensor],
    meta: Mapping[str, Any],
) -> str:
    """Write a checkpoint atomically; returns its version id (sha256)."""
    tensors = {k: v.detach().cpu().contiguous() for k, v in tensors.items()}
    meta_json = json.dumps(meta, sort_keys=True)
    digest = _digest(tensors, meta_json)
    header = {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "kind": kind,
        "meta": meta_json,
        "sha256": digest,
    }
    atomic_write_bytes(path, st_save(tensors, metadata=header))
    return digest


def load_checkpoint(
    path: str | os.PathLike, kind: str | None = None
) -> tuple[dict[str, torch.Tensor], dict[str, Any], str]:
    """Read a checkpoint; returns ``(tensors, meta, version_id)``.

    Raises :class:`CheckpointError` naming the file for anything that is not a
    complete hypsearch checkpoint of the expected kind.
    """
    path = Path(path)
    data = read_named_file(
        path,
        CheckpointError,
        missing="{path}: no such checkpoint file",
        directory="{path}: is a directory, not a checkpoint file",
        unreadable="{path}: cannot read ({reason})",
    )
    header = _read_header(path, data)
    meta_header = header.get("__metadata__") or {}
    if meta_header.get("format") != FORMAT:
        raise CheckpointError(
            f"{path}: not a hypsearch checkpoint (safetensors file of another tool)"
        )
    if meta_header.get("version") != FORMAT_VERSION:
        raise CheckpointError(
            f"{path}: checkpoint format version {meta_header.get('version')!r} is not supported "
            f"(this hypsearch reads version {FORMAT_VERSION})"
        )
    if kind is not None and meta_header.get("kind") != kind:
        raise CheckpointError(
            f"{path}: is a {meta_header.get('kind')!r} checkpoint, expected a {kind!r} checkpoint"
        )
    try:
        tensors = st_load(data)
    except (SafetensorError, Exception) as e:  # safetensors raises several types
        raise CheckpointError(f"{path}: truncated or corrupt checkpoint ({e})") from None
    meta_json = meta_header.get("meta", "{}")
    digest = _digest(tensors, meta_json)
    if digest != meta_header.get("sha256"):
        raise CheckpointError(f"{path}: checksum mismatch, the checkpoint is corrupt")
    return tensors, json.loads(meta_json), digest


def _read_header(path: Path, data: bytes) -> dict[str, Any]:
    if len(data) < 8:
        raise CheckpointError(f"{path}: truncated or not a checkpoint ({len(data)} bytes)")
    n = int.from_bytes(data[:8], "little")
    if n <= 0 or 8 + n > len(data):
        raise CheckpointError(f"{path}: truncated or not a checkpoint (bad header length)")
    try:
        header = json.loads(data[8 : 8 + n])
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise CheckpointError(f"{path}: not a checkpoint (header is not JSON)") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: not a checkpoint (header is not an object)")
    # every tensor must lie inside the file
    end = 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            end = max(end, int(info["data_offsets"][1]))
        except (KeyError, TypeError, ValueError, IndexError):
            raise CheckpointError(f"{path}: not a checkpoint (bad entry {name!r})") from None
    if 8 + n + end > len(data):
        raise CheckpointError(
            f"{path}: truncated checkpoint ({len(data)} bytes, needs {8 + n + end})"
        )
    return header
