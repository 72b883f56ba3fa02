"""The Hugging Face Trainer and Lightning callbacks, training real (tiny) models on CPU."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import fleetlens
import fleetlens.callbacks
from fleetlens.testing import Server

pytestmark = pytest.mark.e2e


def _run(server: Server, run_id: str, tmp_path: Path) -> fleetlens.Run:
    return fleetlens.init(project="frameworks", run_id=run_id, server=server.url,
                          spool_dir=str(tmp_path / f"spool-{run_id}"),
                          install_signal_handler=False, flush_interval=0.05)  # fmt: skip


class Tokens(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    seq = 16

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        ids = (torch.arange(self.seq) * (i % 3 + 1)) % 64
        return {"input_ids": ids, "labels": ids}


@pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning",
                            "ignore::DeprecationWarning")  # fmt: skip
def test_huggingface_trainer_reports_steps_losses_and_checkpoints(
    server: Server, tmp_path: Path
) -> None:
    import transformers

    model = transformers.GPT2LMHeadModel(
        transformers.GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=1, n_head=2)
    )
    run = _run(server, "hf-run", tmp_path)
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"), max_steps=6, per_device_train_batch_size=4,
        logging_steps=1, save_steps=6, report_to=[], use_cpu=True, disable_tqdm=True,
        include_num_input_tokens_seen=True,
    )  # fmt: skip
    trainer = transformers.Trainer(model=model, args=args, train_dataset=Tokens(),
                                   callbacks=[fleetlens.callbacks.huggingface(run)])  # fmt: skip
    trainer.train()
    run.finish()
    assert run.stats()["dropped"] == 0
    info = server.get("/v1/runs/hf-run")
    assert info["steps"] == 6
    assert info["tokensProcessed"] == 6 * 4 * Tokens.seq  # what the Trainer counted
    loss = server.get("/v1/runs/hf-run/metrics?name=loss")["points"]
    # One loss per logged step (HF folds the last step's into its end-of-training summary).
    assert [p["step"] for p in loss][:5] == [1, 2, 3, 4, 5]
    assert all(isinstance(p["value"], float) for p in loss)
    assert server.get("/v1/runs/hf-run/metrics?name=lr")["points"]
    events = server.get("/v1/runs/hf-run/timeline?fromStep=0&toStep=6")["items"]
    assert [e["step"] for e in events if e["kind"] == "checkpoint_end"] == [6]


@pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning",
                            "ignore::DeprecationWarning")  # fmt: skip
def test_lightning_trainer_reports_steps_and_losses(server: Server, tmp_path: Path) -> None:
    import lightning

    class Tiny(lightning.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
            return torch.nn.functional.mse_loss(self.layer(batch), batch.sum(1, keepdim=True))

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.05)

    data = torch.utils.data.DataLoader(torch.randn(64, 4), batch_size=8)
    run = _run(server, "pl-run", tmp_path)
    trainer = lightning.Trainer(
        max_steps=8, accelerator="cpu", logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False,
        callbacks=[fleetlens.callbacks.lightning(run)], default_root_dir=str(tmp_path),
    )  # fmt: skip
    trainer.fit(Tiny(), data)
    run.finish()
    assert run.stats()["dropped"] == 0
    assert server.get("/v1/runs/pl-run")["steps"] == 8
    loss = server.get("/v1/runs/pl-run/metrics?name=loss")["points"]
    assert [p["step"] for p in loss] == list(range(8))
    assert loss[-1]["value"] < loss[0]["value"]
