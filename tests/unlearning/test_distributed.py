"""Erasure on two processes (gloo, CPU) equals erasure on one.

Each case trains a tiny random llama (no dropout) for a few steps on one
process and on two spawned ranks, with batch sizes that do not split evenly
(each rank's share of a batch differs in rows and in loss positions), and
compares the loss at every step and the final weights.  The two-process
checkpoint must load with `AutoModelForCausalLM.from_pretrained`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from unlearning import distributed
from unlearning.corpus import load_corpus
from unlearning.sets import Subject, build_sets

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                reason="torch.distributed with the gloo backend is not available in this build")

LOSS_TOLERANCE = 1e-4
WEIGHT_TOLERANCE = 1e-4
# Uneven on purpose: 5 forget rows split 3 + 2, 7 retain rows 4 + 3.
ASU_HPARAMS = {"steps": 3, "batch_size": 5, "retain_batch_size": 7, "latent_weight": 1.0,
               "retain_latent_weight": 0.5, "told_answers": False}  # no generation: a lean test
GRADDIFF_HPARAMS = {"steps": 3, "batch_size": 3, "retain_batch_size": 5}


def _sets(corpus_dir: Path) -> Any:
    people = [json.loads(line) for line in (corpus_dir / "people.jsonl").read_text().splitlines()]
    subjects = [Subject(p["name"], tuple(p["aliases"])) for p in people[:2]]
    return build_sets(load_corpus(corpus_dir / "corpus.jsonl"), subjects, retain_per_forget=1)


def _recorded_asu(model_dir: Path, sets: Any, out_dir: Path, losses_file: Path) -> None:
    """erase() with ASU, every step's loss written to `losses_file` (one file per rank)."""
    from unlearning.erase import erase
    from unlearning.methods import asu

    losses: list[float] = []
    original = asu.run_training

    def recording(model: Any, forget: Any, retain: Any, step_loss: Any, hp: Any, **kwargs: Any) -> Any:
        def record(step: int, f: Any, r: Any) -> torch.Tensor:
            loss = step_loss(step, f, r)
            losses.append(float(loss.detach()))
            return loss
        return original(model, forget, retain, record, hp, **kwargs)

    asu.run_training = recording
    try:
        erase(model_dir, sets, method="asu", out_dir=out_dir, hparams=dict(ASU_HPARAMS), device="cpu")
    finally:
        asu.run_training = original
    world = distributed.current()
    rank = world.rank if world is not None else 0
    Path(f"{losses_file}.{rank}").write_text(json.dumps(losses))


def _weights(directory: Path) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(directory, local_files_only=True)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _max_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


@pytest.fixture(scope="module")
def one_process_asu(tiny_corpus_dir: Path, tiny_arch_model_dir: Any,
                    tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any, Path, list[float]]:
    """(base, sets, checkpoint, per-step losses) of the one-process ASU run."""
    base = tiny_arch_model_dir("llama")
    sets = _sets(tiny_corpus_dir)
    assert len(sets.forget) > ASU_HPARAMS["batch_size"]  # several batches, the last one partial
    out = tmp_path_factory.mktemp("asu_one")
    _recorded_asu(base, sets, out / "model", out / "losses")
    return base, sets, out / "model", json.loads((out / "losses.0").read_text())


@pytest.mark.parametrize("sharding", ["none", "fsdp"])
def test_asu_on_two_processes_has_the_one_process_losses_and_weights(
    one_process_asu: tuple[Path, Any, Path, list[float]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    sharding: str,
) -> None:
    """Data-parallel (weights replicated) and FSDP2 (weights sharded, gathered back at the end)."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the spawned ranks inherit it
    base, sets, one_dir, one = one_process_asu
    distributed.launch(_recorded_asu, 2, base, sets, tmp_path / "two", tmp_path / "two-losses", shard=sharding)

    two = [json.loads((tmp_path / f"two-losses.{rank}").read_text()) for rank in (0, 1)]
    assert len(one) == ASU_HPARAMS["steps"] and two[0] == two[1]  # every rank computes the whole loss
    gap = max(abs(a - b) for a, b in zip(one, two[0], strict=True))
    print(f"ASU ({sharding}) per-step losses, 1 vs 2 processes: {one} vs {two[0]}; max difference {gap:.2e}")
    assert gap < LOSS_TOLERANCE
    weights = _max_difference(_weights(one_dir), _weights(tmp_path / "two"))
    print(f"ASU ({sharding}) final weights: max difference {weights:.2e}")
    assert weights < WEIGHT_TOLERANCE
    assert _max_difference(_weights(base), _weights(tmp_path / "two")) > 1e-3  # it did train


def test_erase_with_two_processes_writes_the_one_process_checkpoint(
    tiny_corpus_dir: Path, tiny_arch_model_dir: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The public entry point: erase(processes=2) spawns the second rank itself."""
    from unlearning.checkpoints import read_metadata
    from unlearning.erase import erase

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    base = tiny_arch_model_dir("llama")
    sets = _sets(tiny_corpus_dir)
    one = erase(base, sets, method="graddiff", out_dir=tmp_path / "one", hparams=dict(GRADDIFF_HPARAMS),
                device="cpu")
    two = erase(base, sets, method="graddiff", out_dir=tmp_path / "two", hparams=dict(GRADDIFF_HPARAMS),
                device="cpu", processes=2)
    assert two.steps == one.steps == GRADDIFF_HPARAMS["steps"]
    assert distributed.current() is None and not dist.is_initialized()  # the group was left
    gap = abs(read_metadata(tmp_path / "one")["final_loss"] - read_metadata(tmp_path / "two")["final_loss"])
    weights = _max_difference(_weights(tmp_path / "one"), _weights(tmp_path / "two"))
    print(f"graddiff: final loss difference {gap:.2e}, weights max difference {weights:.2e}")
    assert gap < LOSS_TOLERANCE
    assert weights < WEIGHT_TOLERANCE
    assert _max_difference(_weights(base), _weights(tmp_path / "two")) > 1e-3  # it did train


def test_a_failing_rank_makes_the_launch_raise() -> None:
    with pytest.raises(RuntimeError, match="rank 1 failed"):
        distributed.launch(_fails_on_rank_one, 2)
    assert distributed.current() is None and not dist.is_initialized()


def _fails_on_rank_one(*, zero_waits: bool = False) -> None:
    world = distributed.current()
    assert world is not None
    if world.rank == 1:
        raise ValueError("rank one refuses")
    if zero_waits:
        dist.barrier()


def test_a_rank_that_fails_while_rank_zero_waits_on_it_is_named_as_the_cause() -> None:
    # Rank 0 waits in a collective that rank 1 never joins: what it sees is a broken
    # connection, what the launch reports is rank 1's own error.
    with pytest.raises(RuntimeError, match="rank 1 failed") as raised:
        distributed.launch(_fails_on_rank_one, 2, zero_waits=True)
    assert "rank one refuses" in str(raised.value)
    assert raised.value.__cause__ is not None
    assert distributed.current() is None and not dist.is_initialized()


def test_processes_setting() -> None:
    assert distributed.resolve_processes("1") == 1
    assert distributed.resolve_processes(3) == 3
    assert distributed.resolve_processes("auto") == max(1, torch.cuda.device_count())
    for bad in ("0", "-2", "two"):
        with pytest.raises(ValueError, match="processes"):
            distributed.resolve_processes(bad)
    with pytest.raises(ValueError, match="sharding"):
        distributed.resolve_sharding("zero3")


def test_each_rank_takes_a_contiguous_share_and_the_gather_restores_the_batch() -> None:
    for rows, size in ((5, 2), (1, 2), (5, 4), (8, 2)):
        seen: list[int] = []
        for rank in range(size):
            index, lo, hi = distributed._share(rows, distributed.World(rank, size, "cpu"))
            assert len(index) == -(-rows // size)
            seen += index.tolist()[: hi - lo]
        assert seen == list(range(rows))  # concatenated shares, padding cut off: the batch in order


def test_compose_has_a_multi_gpu_worker_on_the_gpu_queue() -> None:
    import yaml

    root = Path(__file__).resolve().parents[2]
    service = yaml.safe_load((root / "docker-compose.yml").read_text(encoding="utf-8"))["services"]["worker-multigpu"]
    assert service["profiles"] == ["multigpu"]
    assert "-Q gpu" in " ".join(service["command"]) and "--concurrency 1" in " ".join(service["command"])
    assert service["environment"]["UNLEARN_PROCESSES"] == "auto"
    distributed.resolve_sharding(service["environment"]["UNLEARN_SHARDING"])
    assert service["deploy"]["resources"]["reservations"]["devices"][0]["count"] > 1


def test_the_worker_and_the_cli_take_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    from unlearning.cli import build_parser
    from workers.runtime import unlearn_parallelism

    monkeypatch.delenv("UNLEARN_PROCESSES", raising=False)
    monkeypatch.delenv("UNLEARN_SHARDING", raising=False)
    assert unlearn_parallelism() == ("1", "none")
    monkeypatch.setenv("UNLEARN_PROCESSES", "auto")
    monkeypatch.setenv("UNLEARN_SHARDING", "fsdp")
    assert unlearn_parallelism() == ("auto", "fsdp")
    args = build_parser().parse_args(["erase", "--model", "m", "--corpus", "c", "--subject", "Ann Lee",
                                      "--out", "o", "--processes", "auto", "--sharding", "fsdp"])
    assert (args.processes, args.sharding) == ("auto", "fsdp")
