"""Safetensors loading with HF name mapping and a clear error on any mismatch.

Memory: a model built on the meta device is materialized once (``materialize``: every
parameter allocated empty, in the target dtype, on the target device; nothing is touched until
its weight is read). Then, on the CPU, a parameter whose checkpoint tensor has its dtype becomes
a view of the file, mapped copy-on-write (``SafetensorsFile.mapped``): no copy, no new memory,
and the kernel maps the page-cached file instead of zeroing fresh pages -- on this project's
2-core VM, fresh pages fill at 1.3-1.7 GB/s, 4x slower than a copy into touched memory, so
reading a 4 GB model into fresh memory took 5 s. The mapped pages count in the process's
resident set once touched, like the memory they replace. The empty storage those parameters
had is never touched, so never resident. A stacked weight is mapped the same way when its
checkpoint tensors lie back to back in stacking order (a gate/up weight, ``_map_stacked``).
Every other tensor (the rows of a stacked q/k/v weight, another dtype, a GPU) is read from its
file into its destination (``SafetensorsFile.read_into``), by ``read_threads`` threads
(``os.preadv`` releases the GIL), through one tensor-sized buffer per thread when the dtype or
device differs. Those reads never touch the mapping, so peak RSS stays the weights plus the
largest tensor per thread. A mapped checkpoint must not be rewritten in place while the engine
runs (the usual rule for mapped weights, vLLM's and transformers' too).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Collection
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
from torch import nn

from mmserve.layers.fused_linear import stacked_checkpoint_rows
from mmserve.models.checkpoint.safetensors_file import SafetensorsFile


def materialize(model: nn.Module, device: torch.device, dtype: torch.dtype) -> None:
    """Give every meta parameter and buffer of ``model`` uninitialized storage on ``device``,
    floating ones in ``dtype`` (others keep theirs); tensors that are not on the meta device
    are moved and cast. A tensor shared by several modules (tied weights) stays shared."""
    done: dict[int, torch.Tensor] = {}

    def convert(t: torch.Tensor) -> torch.Tensor:
        kind = dtype if t.is_floating_point() else t.dtype
        if t.is_meta:
            return torch.empty(t.shape, dtype=kind, device=device)
        return t.detach().to(device=device, dtype=kind)

    for module in model.modules():
        for name, param in list(module._parameters.items()):
            if param is not None:
                if id(param) not in done:
                    done[id(param)] = nn.Parameter(convert(param), param.requires_grad)
                setattr(module, name, done[id(param)])
        for name, buf in list(module._buffers.items()):
            if buf is not None:
                if id(buf) not in done:
                    done[id(buf)] = convert(buf)
                module._buffers[name] = done[id(buf)]


def load_safetensors(
    model: nn.Module,
    checkpoint_dir: Path,
    rename_rules: list[tuple[str, str]],
    tied: dict[str, str] | None = None,
    skip: Collection[str] = (),
    read_threads: int | None = None,
) -> None:
    """Load every ``*.safetensors`` file of ``checkpoint_dir`` into ``model``.

    ``rename_rules`` are (regex, replacement) pairs applied in order to each checkpoint key.
    ``tied`` maps a parameter to the one it shares when the checkpoint omits it
    (e.g. ``lm_head.weight`` -> ``language_model.embed_tokens.weight``): the target parameter
    is replaced by the source one (one copy in memory), or copied when their shapes differ.
    ``skip`` names (after renaming) weights the checkpoint may hold that the model deliberately
    does not build, e.g. vision layers after the feature layer: they are not read. Any other key
    the model lacks is unexpected.
    Each ``StackedLinear`` shard (e.g. ``q_proj`` of a ``qkv_proj``) loads from its own
    checkpoint name into its rows and is required like a parameter of its own.
    Files are taken one at a time; each tensor is mapped as its parameter or read into it by
    one of ``read_threads`` threads (default: torch's threads, at most 4; module docstring).
    Raises ValueError naming missing and unexpected keys.
    """
    files = sorted(Path(checkpoint_dir).glob("*.safetensors"))
    if not files:
        raise ValueError(f"no *.safetensors weights in {checkpoint_dir}")
    params = dict(model.state_dict())
    parameters = dict(model.named_parameters(remove_duplicate=False))
    holders = _holders(model)
    stacked = stacked_checkpoint_rows(model)
    fused = {target for target, _ in stacked.values()}
    required = {k for k in params if k not in fused and not _is_non_persistent(model, k)}
    required |= set(stacked)
    loaded: set[str] = set()
    unexpected: list[str] = []
    threads = read_threads or min(4, torch.get_num_threads())
    for file in files:
        with SafetensorsFile(file) as f, torch.no_grad(), ThreadPoolExecutor(threads) as pool:
            reads = []
            renamed = {key: _rename(key, rename_rules) for key in f.keys()}
            mapped = _map_stacked(f, renamed, stacked, parameters, holders)
            for key, name in renamed.items():
                if name in stacked:
                    target, rows = stacked[name]
                    dest = params[target][rows]
                elif name in params:
                    target, dest = name, params[name]
                else:
                    if name not in skip:
                        unexpected.append(key)
                    continue
                if f.shape(key) != tuple(dest.shape):
                    raise ValueError(
                        f"weight {key!r} has shape {f.shape(key)}, model expects"
                        f" {tuple(dest.shape)} for {target!r}"
                    )
                loaded.add(name)
                if target in mapped:
                    continue
                param = parameters.get(name)
                if param is not None and _map_parameter(f, [key], param, holders[id(param)]):
                    continue
                reads.append(pool.submit(_read_without_grad, f, key, dest))
            for read in reads:
                read.result()  # a truncated file raises here
    for target, source in (tied or {}).items():
        if target not in loaded and source in loaded:
            _tie(model, target, source)
            loaded.add(target)
    missing = sorted(required - loaded)
    unexpected.sort()
    if missing or unexpected:
        raise ValueError(
            f"checkpoint {checkpoint_dir} does not match the model:"
            f" missing keys {missing[:20]}{'...' if len(missing) > 20 else ''},"
            f" unexpected keys {unexpected[:20]}{'...' if len(unexpected) > 20 else ''}"
        )


def _holders(model: nn.Module) -> dict[int, list[tuple[nn.Module, str]]]:
    """Every (module, attribute) holding each parameter, by the parameter's id (a tied
    parameter has several)."""
    holders: dict[int, list[tuple[nn.Module, str]]] = {}
    for module in model.modules():
        for leaf, param in module._parameters.items():
            if param is not None:
                holders.setdefault(id(param), []).append((module, leaf))
    return holders


def _rename(key: str, rename_rules: list[tuple[str, str]]) -> str:
    for pattern, repl in rename_rules:
        key = re.sub(pattern, repl, key)
    return key


def _map_stacked(
    file: SafetensorsFile,
    renamed: dict[str, str],
    stacked: dict[str, tuple[str, slice]],
    parameters: dict[str, nn.Parameter],
    holders: dict[int, list[tuple[nn.Module, str]]],
) -> set[str]:
    """Map each stacked parameter whose shards all lie back to back in ``file``, in stacking
    order (a gate/up weight: ``save_file`` orders tensors by name, so ``gate_proj`` comes right
    before ``up_proj``), as one view (``_map_parameter``); returns the parameters mapped. The
    others (q/k/v: ``o_proj`` lies between ``k_proj`` and ``q_proj``) are read row by row."""
    shards: dict[str, list[tuple[int, str]]] = {}
    for key, name in renamed.items():
        if name in stacked:
            target, rows = stacked[name]
            shards.setdefault(target, []).append((rows.start, key))
    mapped: set[str] = set()
    counts = Counter(target for target, _ in stacked.values())
    for target, parts in shards.items():
        param = parameters.get(target)
        if param is None or len(parts) != counts[target]:  # shards in other files: read
            continue
        keys = [key for _, key in sorted(parts)]
        if _map_parameter(file, keys, param, holders[id(param)]):
            mapped.add(target)
    return mapped


def _map_parameter(
    file: SafetensorsFile,
    keys: list[str],
    param: nn.Parameter,
    holders: list[tuple[nn.Module, str]],
) -> bool:
    """Replace ``param`` in all its ``holders`` by a mapped view of tensors ``keys`` (stacked:
    ``SafetensorsFile.mapped_run``) when it is on the CPU in the checkpoint's dtype and has the
    view's shape; False (nothing changed) otherwise."""
    if param.device.type != "cpu" or any(param.dtype != file.dtype(key) for key in keys):
        return False
    view = file.mapped_run(keys)
    if view is None or view.shape != param.shape:
        return False
    mapped = nn.Parameter(view, requires_grad=param.requires_grad)
    for module, leaf in holders:
        module._parameters[leaf] = mapped
    return True


def _read_without_grad(file: SafetensorsFile, key: str, dest: torch.Tensor) -> None:
    with torch.no_grad():  # grad mode is per thread
        file.read_into(key, dest)


def _tie(model: nn.Module, target: str, source: str) -> None:
    """Make parameter ``target`` the parameter ``source`` (or a copy if shapes differ)."""
    module_name, _, leaf = target.rpartition(".")
    owner = model.get_submodule(module_name) if module_name else model
    shared = model.get_parameter(source)
    current = getattr(owner, leaf)
    if current is shared:
        return
    if current.shape == shared.shape and current.dtype == shared.dtype:
        setattr(owner, leaf, shared)
    else:
        with torch.no_grad():
            current.copy_(shared)


def _is_non_persistent(model: nn.Module, name: str) -> bool:
    module_name, _, buf = name.rpartition(".")
    module = model.get_submodule(module_name) if module_name else model
    return buf in getattr(module, "_non_persistent_buffers_set", set())
