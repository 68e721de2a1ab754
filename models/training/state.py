"""The state of an unfinished training run: one checkpoint file, written after every epoch.

The file is a model checkpoint (kind ``model``, see :mod:`models.vision.image_model`)
with ``partial: true`` and, beside the model's tensors, the optimiser's
(``optim.<i>.<name>``) and the auxiliary classifier's (``aux.``), and under
``run`` in the metadata the configuration key, the optimiser's scalars, the
epoch, the history and the seconds spent. Resuming restores every one of
them exactly, so a resumed run goes on as the uninterrupted run would have.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from ..checkpoint import CheckpointError, load_checkpoint
from ..labels import LabelEmbedding
from ..vision.image_model import KIND, ImageModel
from .config import TrainConfig, TrainError

__all__ = ["Resumed", "load_partial_config", "resume_run", "save_run"]


def _optimizer_tensors(opt: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict]:
    sd = opt.state_dict()
    tensors, scalars = {}, {}
    for i, st in sd["state"].items():
        for k, v in st.items():
            if torch.is_tensor(v):
                tensors[f"optim.{i}.{k}"] = v.reshape(-1) if v.dim() == 0 else v
                if v.dim() == 0:
                    scalars[f"{i}.{k}.0d"] = True
            else:
                scalars[f"{i}.{k}"] = v
    groups = [
        {k: (list(v) if isinstance(v, tuple) else v) for k, v in g.items()}
        for g in sd["param_groups"]
    ]
    return tensors, {"scalars": scalars, "param_groups": groups}


def _load_optimizer(opt: torch.optim.Optimizer, tensors: dict, meta: dict) -> None:
    state: dict[int, dict] = {}
    plain: dict[tuple[int, str], object] = {}  # Python scalars (geoopt's int step counts)
    for name, v in tensors.items():
        if name.startswith("optim."):
            _, i, k = name.split(".", 2)
            state.setdefault(int(i), {})[k] = v
    for key, v in meta["scalars"].items():
        i, k = key.split(".", 1)
        if k.endswith(".0d"):
            state[int(i)][k[:-3]] = state[int(i)][k[:-3]].reshape(())
        else:
            state.setdefault(int(i), {})[k] = v
            plain[int(i), k] = v
    groups = [
        {k: (tuple(v) if k == "betas" else v) for k, v in g.items()} for g in meta["param_groups"]
    ]
    opt.load_state_dict({"state": state, "param_groups": groups})
    # torch turns an int "step" into a float32 tensor, and geoopt's bias corrections
    # 1 - beta**step then round differently from the uninterrupted run's: put them back
    params = [p for g in opt.param_groups for p in g["params"]]
    for (i, k), v in plain.items():
        opt.state[params[i]][k] = v


def save_run(
    path: Path,
    model: ImageModel,
    opt: torch.optim.Optimizer,
    aux: nn.Module | None,
    cfg: TrainConfig,
    *,
    epoch: int,
    history: list[dict],
    seconds: float,
    extra: nn.Module | None = None,
) -> None:
    """Write the run state after ``epoch`` epochs (``model``: the one being trained, no metrics;
    ``extra``: the auxiliary terms' parts, :class:`models.training.objectives.Extras`)."""
    tensors, optim = _optimizer_tensors(opt)
    if aux is not None:
        tensors |= {f"aux.{k}": v.detach() for k, v in aux.state_dict().items()}
    if extra is not None:
        tensors |= {
            f"extra.{k}": (v.detach().reshape(-1) if v.dim() == 0 else v.detach())
            for k, v in extra.state_dict().items()
        }
    run = {
        "config_key": cfg.key(),
        "optim": optim,
        "epoch": epoch,
        "history": history,
        "seconds": seconds,
    }
    model.save(path, extra_tensors=tensors, extra_meta={"run": run, "partial": True})


@dataclass
class Resumed:
    """Where a resumed run stands: epochs done, their history, seconds already spent."""

    epoch: int
    history: list[dict]
    seconds: float


def resume_run(
    path: Path,
    cfg: TrainConfig,
    labels: LabelEmbedding,
    modules: dict[str, nn.Module],
    opt: torch.optim.Optimizer,
) -> Resumed:
    """Load the run state at ``path`` into ``modules`` (prefix -> module) and ``opt``.

    Raises :class:`TrainError` when the file is the run of another
    configuration (all but ``epochs``) or of other labels.
    """
    tensors, meta, _ = load_checkpoint(path, kind=KIND)
    run = meta.get("run", {})
    if run.get("config_key") != cfg.key() or meta.get("labels_version") != labels.version:
        raise TrainError(
            f"{path}: unfinished run of another configuration or labels (use --restart)"
        )
    for prefix, module in modules.items():
        state = {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}
        for k, v in module.state_dict().items():
            if v.dim() == 0 and k in state:
                state[k] = state[k].reshape(())
        module.load_state_dict(state)
    _load_optimizer(opt, tensors, run["optim"])
    return Resumed(int(run["epoch"]), list(run["history"]), float(run["seconds"]))


def load_partial_config(path: str | os.PathLike) -> dict | None:
    """The training config of an unfinished run at ``path`` (None when there is none)."""
    try:
        _, meta, _ = load_checkpoint(path, kind=KIND)
    except CheckpointError:
        return None
    return meta.get("config") if meta.get("partial") else None
