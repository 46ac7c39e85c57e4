"""Erasure on several processes (several GPUs), equal to the one-process run.

``erase(..., processes=N)`` runs the caller as rank 0 (its progress callback
and heartbeat keep working) and spawns ranks 1..N-1; `accelerate launch` or
`torchrun` may start the ranks instead (``world_from_env``).  The process group
is set up by accelerate's `PartialState` (NCCL on one GPU per rank when the
machine has as many GPUs as ranks, gloo on CPU otherwise).

**What is split, and why the losses equal the one-process run.**  Every rank
sees the same global batches in the same order.  While `run_training` runs,
the trained model's forward (`sharded_forward`) runs the network on this
rank's contiguous share of the rows only, then gathers the outputs (logits,
hidden states) of every rank, so each method's loss is computed on the *whole*
batch, on every rank, with the whole batch's normalisers (per-sequence means,
per-token means, whatever the method uses): the loss is the one-process loss.
The gather's backward hands each rank the gradient of its own rows; summing
the parameter gradients over the ranks (`sync_gradients`, in place of DDP's
average) gives the whole-batch gradient; clipping and AdamW then run on the
same numbers everywhere.  The only differences from one process are float
re-association in the sums (measured in tests/unlearning/test_distributed.py)
and dropout, which draws per rank: exactness holds for models trained without
dropout (every model this project builds; `config.*dropout` is 0 there).

**Sharded parameters (FSDP).**  ``shard="fsdp"`` (``UNLEARN_SHARDING=fsdp``)
additionally shards parameters, gradients and AdamW state with PyTorch's FSDP2
(`fully_shard`, one unit per transformer block as accelerate's
``transformer_based_wrap`` does, plus the root) for a model whose training
state does not fit one device; at the end the full weights are gathered back
into the same module on every rank, so saving works as before.  The method's
one-off target pass before training still runs on the whole model on each
rank (it must fit one device for inference).
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import sys
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
from torch import nn

logger = logging.getLogger(__name__)

SHARDING = ("none", "fsdp")
PROCESS_GROUP_TIMEOUT = timedelta(minutes=30)
BUCKET_ELEMENTS = 32 * 1024 * 1024  # gradients are summed in flat buckets of at most this many elements
BATCH_KEYS = ("input_ids", "attention_mask", "position_ids", "inputs_embeds", "token_type_ids")


@dataclass(frozen=True)
class World:
    rank: int
    size: int
    device: str
    shard: str = "none"

    @property
    def main(self) -> bool:
        return self.rank == 0


_current: World | None = None


def current() -> World | None:
    """The world of the running distributed erasure, or None (one process)."""
    return _current


def resolve_processes(value: str | int | None) -> int:
    """``UNLEARN_PROCESSES``: a positive number, or ``auto`` (one per CUDA device, at least 1)."""
    text = str(value if value is not None else "1").strip().lower() or "1"
    if text == "auto":
        return max(1, torch.cuda.device_count())
    try:
        number = int(text)
    except ValueError:
        raise ValueError(f"processes must be a positive number or 'auto', got {value!r}") from None
    if number < 1:
        raise ValueError(f"processes must be a positive number or 'auto', got {value!r}")
    return number


def resolve_sharding(value: str | None) -> str:
    text = (value or "none").strip().lower()
    if text not in SHARDING:
        raise ValueError(f"sharding must be one of {', '.join(SHARDING)}, got {value!r}")
    return text


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def world(rank: int, size: int, *, port: int | None = None, shard: str = "none") -> Iterator[World]:
    """Join (and at the end leave) a process group of ``size`` ranks as ``rank``.

    Without ``port`` the rendezvous comes from the environment (`accelerate launch`,
    `torchrun`); with one, from 127.0.0.1:port (the ranks `launch` spawns).
    """
    global _current
    import torch.distributed as dist
    from accelerate import PartialState

    if _current is not None or dist.is_initialized():
        raise RuntimeError("a distributed erasure is already running in this process")
    use_cuda = torch.cuda.is_available() and torch.cuda.device_count() >= size
    saved = {k: os.environ.get(k) for k in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE",
                                            "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
    if port is not None:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                          WORLD_SIZE=str(size), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(size))
    PartialState._reset_state()
    try:
        state = PartialState(cpu=not use_cuda, timeout=PROCESS_GROUP_TIMEOUT)
        if state.num_processes != size or state.process_index != rank:
            raise RuntimeError(f"process group is rank {state.process_index} of {state.num_processes}, "
                               f"expected {rank} of {size}")
        device = f"cuda:{state.local_process_index}" if use_cuda else "cpu"
        _current = World(rank, size, device, resolve_sharding(shard))
        logger.info("distributed erasure: rank %s of %s on %s (%s, sharding %s)", rank, size, device,
                    dist.get_backend(), _current.shard)
        yield _current
    finally:
        _current = None
        if dist.is_initialized():
            dist.destroy_process_group()
        PartialState._reset_state()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def world_from_env() -> tuple[int, int] | None:
    """(rank, size) when a launcher (accelerate launch, torchrun) started this process as one of several."""
    size = int(os.environ.get("WORLD_SIZE", "1") or 1)
    if size <= 1 or "RANK" not in os.environ:
        return None
    return int(os.environ["RANK"]), size


# ------------------------------------------------------------------ launching


def _child(rank: int, size: int, port: int, shard: str, fn: Callable[..., Any], args: tuple[Any, ...],
           kwargs: dict[str, Any], errors: Any) -> None:
    reported = False
    try:
        logging.basicConfig(level=logging.WARNING)
        with world(rank, size, port=port, shard=shard):
            try:
                fn(*args, **kwargs)
            except BaseException:
                # Reported before the group is torn down: a rank waiting on this one sees the
                # closed connection only after the report is in the queue.
                errors.put((rank, traceback.format_exc()))
                reported = True
                raise
    except BaseException:  # noqa: BLE001 - reported to rank 0, which raises it
        if not reported:
            errors.put((rank, traceback.format_exc()))
        raise SystemExit(1) from None
    # The work is done and the process group left.  Skip the interpreter's teardown:
    # gloo's and FSDP's background threads can crash while it unloads modules, which
    # turned a finished rank into a failed one with no traceback.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def launch(fn: Callable[..., Any], processes: int, *args: Any, shard: str = "none",
           child_kwargs: dict[str, Any] | None = None, **kwargs: Any) -> Any:
    """Run ``fn(*args, **kwargs)`` as rank 0 of ``processes`` ranks; the others are spawned.

    Ranks 1.. get ``kwargs`` updated with ``child_kwargs`` (e.g. no progress callback).
    Returns rank 0's result; a rank that fails makes the whole run raise.
    """
    import multiprocessing

    if processes < 2:
        return fn(*args, **kwargs)
    port = free_port()
    context = multiprocessing.get_context("spawn")
    errors = context.SimpleQueue()
    others = {**kwargs, **(child_kwargs or {})}
    children = [context.Process(target=_child, args=(rank, processes, port, shard, fn, args, others, errors),
                                daemon=True, name=f"unlearning-rank-{rank}")
                for rank in range(1, processes)]
    for child in children:
        child.start()
    # A rank that fails first leaves rank 0 with only a broken connection (gloo: "Connection
    # closed by peer"), in a collective or still setting the group up: that rank's report,
    # queued before its connections closed, is the cause.  Rank 0's own failure is checked
    # for such a report while the group still stands, before tearing it down makes the
    # other ranks fail in turn.
    own: BaseException | None = None
    try:
        with world(0, processes, port=port, shard=shard):
            try:
                result = fn(*args, **kwargs)
            except BaseException as error:
                own = error
                if isinstance(error, Exception) and not errors.empty():
                    own = _rank_failed(*errors.get())
                    raise own from error
                raise
    except BaseException as error:
        for child in children:
            if child.is_alive():
                child.terminate()
        for child in children:
            child.join(timeout=30)
        if own is None and isinstance(error, Exception) and not errors.empty():
            raise _rank_failed(*errors.get()) from error  # rank 0 failed setting the group up
        raise
    for child in children:
        child.join()
    failed = [c for c in children if c.exitcode != 0]
    if failed:
        if not errors.empty():
            rank, detail = errors.get()
        else:
            child = failed[0]
            rank = children.index(child) + 1
            code = child.exitcode
            detail = (f"killed by signal {-code}" if code is not None and code < 0 else f"exit code {code}") \
                + " without a Python traceback (out of memory, or a crash in native code)"
        raise _rank_failed(rank, detail)
    return result


def _rank_failed(rank: int, detail: str) -> RuntimeError:
    return RuntimeError(f"distributed erasure: rank {rank} failed:\n{detail}")


# ------------------------------------------------------------------ the split forward


def _share(rows: int, w: World) -> tuple[torch.Tensor, int, int]:
    """This rank's row indices (padded to the common share), and its real rows' [lo, hi)."""
    chunk = -(-rows // w.size)
    lo, hi = min(rows, w.rank * chunk), min(rows, (w.rank + 1) * chunk)
    index = list(range(lo, hi)) + [rows - 1] * (chunk - (hi - lo))
    return torch.tensor(index, dtype=torch.long), lo, hi


class _Gather(torch.autograd.Function):
    """All ranks' shares concatenated (the whole batch); backward: this rank's rows' gradient."""

    @staticmethod
    def forward(ctx: Any, local: torch.Tensor, rows: int, rank: int) -> torch.Tensor:
        import torch.distributed as dist

        local = local.contiguous()
        parts = [torch.empty_like(local) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, local)
        ctx.chunk, ctx.rank, ctx.rows = local.shape[0], rank, rows
        return torch.cat(parts)[:rows]

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, None, None]:
        lo = min(ctx.rows, ctx.rank * ctx.chunk)
        mine = grad[lo:lo + ctx.chunk]
        out = grad.new_zeros((ctx.chunk, *grad.shape[1:]))
        out[: mine.shape[0]] = mine
        return out, None, None


def _gather_value(value: Any, rows: int, chunk: int, w: World) -> Any:
    if isinstance(value, torch.Tensor) and value.dim() >= 1 and value.shape[0] == chunk:
        return _Gather.apply(value, rows, w.rank)  # type: ignore[no-untyped-call]
    if isinstance(value, tuple | list) and value and all(isinstance(v, torch.Tensor) for v in value):
        return type(value)(_gather_value(v, rows, chunk, w) for v in value)
    return value


@contextlib.contextmanager
def sharded_forward(model: nn.Module, w: World) -> Iterator[None]:
    """While inside: ``model(...)`` runs on this rank's rows and returns the whole batch's outputs."""
    pending: list[tuple[int, int]] = []

    def before(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        first = kwargs.get("input_ids", args[0] if args else None)
        if first is None:
            first = kwargs.get("inputs_embeds")
        if not isinstance(first, torch.Tensor):
            raise TypeError("a sharded forward needs input_ids (or inputs_embeds) as a tensor")
        if kwargs.get("labels") is not None:
            raise ValueError("a sharded forward does not take labels: compute the loss from the logits")
        rows = int(first.shape[0])
        index, _, _ = _share(rows, w)
        index = index.to(first.device)
        pending.append((rows, int(index.shape[0])))
        new_args = tuple(a.index_select(0, index) if i == 0 and isinstance(a, torch.Tensor) else a
                         for i, a in enumerate(args))
        new_kwargs = {k: (v.index_select(0, index) if k in BATCH_KEYS and isinstance(v, torch.Tensor)
                          and v.shape[0] == rows else v) for k, v in kwargs.items()}
        return new_args, new_kwargs

    def after(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> Any:
        rows, chunk = pending.pop()
        if isinstance(output, dict):  # transformers' ModelOutput
            values = {k: (None if k == "past_key_values" else _gather_value(v, rows, chunk, w))
                      for k, v in output.items()}
            return type(output)(**values)
        if isinstance(output, tuple):
            return tuple(_gather_value(v, rows, chunk, w) for v in output)
        return _gather_value(output, rows, chunk, w)

    handles = [model.register_forward_pre_hook(before, with_kwargs=True),
               model.register_forward_hook(after, with_kwargs=True)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


# ------------------------------------------------------------------ gradients and parameters


def broadcast_parameters(params: Sequence[nn.Parameter]) -> None:
    """Rank 0's values everywhere (a LoRA adapter's random start, say)."""
    import torch.distributed as dist

    with torch.no_grad():
        for p in params:
            dist.broadcast(p.data, src=0)


def sync_gradients(params: Sequence[nn.Parameter]) -> None:
    """Sum every parameter's gradient over the ranks (each rank holds its rows' share of it).

    A parameter no rank has a gradient for stays without one (AdamW skips it, as in
    one process); one that some rank lacks gets zeros there first.
    """
    import torch.distributed as dist
    from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

    if not params:
        return
    device = params[0].device
    present = torch.tensor([p.grad is not None for p in params], dtype=torch.int32, device=device)
    dist.all_reduce(present, op=dist.ReduceOp.MAX)
    grads: list[torch.Tensor] = []
    for p, flag in zip(params, present.tolist(), strict=True):
        if not flag:
            continue
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        grads.append(p.grad)
    bucket: list[torch.Tensor] = []

    def flush() -> None:
        if not bucket:
            return
        flat = _flatten_dense_tensors(bucket)  # type: ignore[no-untyped-call]
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        for grad, summed in zip(bucket, _unflatten_dense_tensors(flat, bucket),  # type: ignore[no-untyped-call]
                                 strict=True):
            grad.copy_(summed)
        bucket.clear()

    size = 0
    for grad in grads:
        if bucket and (grad.dtype != bucket[0].dtype or grad.device != bucket[0].device
                       or size + grad.numel() > BUCKET_ELEMENTS):
            flush()
            size = 0
        bucket.append(grad)
        size += grad.numel()
    flush()


# ------------------------------------------------------------------ sharded parameters (FSDP2)


def fsdp_shard(model: nn.Module, w: World) -> None:
    """Shard the model in place with FSDP2: one unit per transformer block, then the root.

    The blocks are the classes the model names in `_no_split_modules` (what accelerate's
    ``transformer_based_wrap`` shards by); parameters become DTensor shards.
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cuda" if w.device.startswith("cuda") else "cpu", (w.size,))
    blocks: set[str] = set()
    for module in model.modules():
        blocks |= set(getattr(module, "_no_split_modules", None) or ())
    for module in list(model.modules())[1:]:
        if type(module).__name__ in blocks:
            fully_shard(module, mesh=mesh)
    fully_shard(model, mesh=mesh)


def fsdp_unshard(model: nn.Module) -> None:
    """Undo `fsdp_shard` in place: full weights in plain parameters on every rank, FSDP's hooks off.

    Collective (every rank gathers every parameter, in the same order).  Parameters that
    were shared (tied embeddings) stay one parameter.
    """
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor

    sharded: list[Any] = [m for m in model.modules() if isinstance(m, FSDPModule)]
    for module in sharded:
        module.reshard()
    full: dict[int, nn.Parameter] = {}
    for module in model.modules():
        for name, param in list(module._parameters.items()):
            if isinstance(param, DTensor):
                if id(param) not in full:
                    full[id(param)] = nn.Parameter(param.full_tensor().detach().clone(),
                                                   requires_grad=param.requires_grad)
                module._parameters[name] = full[id(param)]
    for module in sharded:
        state = module._get_fsdp_state()
        for handle in (getattr(state, "_pre_forward_hook_handle", None),
                       getattr(state, "_post_forward_hook_handle", None)):
            if handle is not None:
                handle.remove()
        group = getattr(state, "_fsdp_param_group", None)
        if group is not None:
            for handles in (group._module_to_pre_save_state_dict_hook_handle,
                            group._module_to_pre_load_state_dict_hook_handle):
                for handle in handles.values():
                    handle.remove()
            for fsdp_param in group.fsdp_params:
                handle = getattr(fsdp_param, "_post_load_hook_handle", None)
                if handle is not None:
                    handle.remove()
        original = [base for base in type(module).__bases__ if base is not FSDPModule]
        module.__class__ = original[0]
