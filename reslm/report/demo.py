"""The demo's table and samples (`reslm demo`), as the text the command prints."""
from __future__ import annotations

from reslm.core.metrics import TEST_LOSS, bits, final_of
from reslm.paper import PROTOCOL
from reslm.report.rows import lr_words


def demo_text(result: dict) -> str:
    """The budget in words, one row per run (trainable parameters, test CE in nats and bits per character,
    train and reservoir seconds) and each run's sample; `result` is what run_demo returns."""
    o = result["train"]
    L = ["", f"Demo budget (the paper: {PROTOCOL['epochs_per_shard']} epochs on each full shard, batch "
         f"{PROTOCOL['batch_size']}, lr {lr_words(PROTOCOL['lr'])}): the first "
         f"{o['shard_chars']:,} characters of each training shard, {o['epoch_samples']:,} samples "
         f"per shard-epoch, {o['epochs_per_shard']} epoch per shard, {o['cycles']} cycle, batch "
         f"{o['batch_size']}, lr {o['lr']}; test cross-entropy on {o['eval_samples']:,} "
         f"samples spread over the test shard.",
         f"{'preset':<13}{'trainable':>10}{'test CE (nats)':>16}{'bits/char':>11}{'train s':>9}{'reservoir s':>13}"]
    for s in result["summaries"]:
        L.append(f"{s['preset']:<13}{s['trainable_params']:>10,}{s[final_of(TEST_LOSS)]:>16.4f}"
                 f"{bits(s[final_of(TEST_LOSS)]):>11.3f}{s['train_seconds']:>9.1f}{s['reservoir_seconds']:>13.1f}")
    L.append("")
    for name, text in result["samples"].items():
        L += [f"--- {name} (temperature 0.8) ---", text, ""]
    return "\n".join(L)
