"""Pushing a run to the Hugging Face Hub (``push_to_hub`` and the ``hub_*`` fields of :class:`gtpo.GTPOConfig`), as
transformers' Trainer does (``init_hf_repo``, ``_push_from_checkpoint``, ``push_to_hub``):

* at the start of training the repository ``hub_model_id`` (default: the name of ``output_dir``) is created if it
  does not exist (``HfApi.create_repo(exist_ok=True, private=hub_private_repo)``; main process only);
* at each checkpoint (``hub_strategy`` ``every_save``, ``checkpoint``, ``all_checkpoints``) the checkpoint's model
  (or adapter) and tokenizer files, with ``metrics.jsonl``, ``completions.jsonl`` and ``run_config.json``, go to the
  repository's root in one commit "Training in progress, step N" ("epoch N" with ``save_strategy: epoch``);
  ``checkpoint`` also uploads the whole checkpoint to ``last-checkpoint/``, ``all_checkpoints`` to
  ``checkpoint-N/`` (commit "..., checkpoint"). These uploads run in the background (one at a time; a checkpoint
  saved while the previous push is still uploading is not pushed unless ``hub_always_push``), from a staging
  directory of hard links (``output_dir/.tmp-checkpoint-upload-N``), so that deleting an old checkpoint
  (``save_total_limit``) never pulls files from under an upload. A failed upload is logged as an error and training
  goes on: the checkpoint is saved locally first, and the end of training pushes the final model again. A stop
  checkpoint (SIGTERM/SIGINT) is not pushed: the process is being stopped, and waits only for a push under way;
* at the end (every ``hub_strategy``) the final model, tokenizer and logs in ``output_dir`` (not its checkpoints,
  hidden files or ``sft-warmup/``) in one blocking commit "End of training"; a failure raises
  :class:`gtpo.errors.HubUploadError` after the final model is saved locally.

``hub_token`` is passed to ``huggingface_hub`` only: never logged nor written (``GTPOConfig.to_dict`` hides it).
With ``HF_HUB_OFFLINE`` set, ``push_to_hub: true`` is refused before the model loads (:func:`check_push_to_hub`).
"""

from __future__ import annotations

import logging
import os
import shutil
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from ..errors import ConfigValueError, HubUploadError
from .checkpoint import LEGACY_STATE_FILE, STATE_FILE, TMP_PREFIX

logger = logging.getLogger("gtpo")

__all__ = ["COMMIT_END", "HubPusher", "check_push_to_hub", "hub_offline", "repo_name"]

COMMIT_END = "End of training"
#: the files of a checkpoint that are not the model: never pushed to the repository's root
NOT_MODEL_FILES = ("optimizer.pt", "scheduler.pt", "rng_state_*.pth", STATE_FILE, LEGACY_STATE_FILE)
#: the logs of output_dir pushed with each checkpoint's model
LOG_FILES = ("metrics.jsonl", "completions.jsonl", "run_config.json")
#: what of output_dir the final push leaves out: checkpoints, hidden and temporary files, the SFT warm-up model
FINAL_IGNORE = ("checkpoint-*", ".*", "_*", "sft-warmup/*")
UPLOAD_PREFIX = TMP_PREFIX + "upload-"


def hub_offline() -> bool:
    """Whether huggingface_hub runs offline (``HF_HUB_OFFLINE``): every request to the Hub would fail."""
    import huggingface_hub

    return bool(huggingface_hub.is_offline_mode())


def check_push_to_hub(config: Any, *, where: str = "GTPOConfig") -> None:
    """``push_to_hub: true`` needs the Hub: :class:`ConfigValueError` (field ``push_to_hub``) when huggingface_hub is
    offline; ``where`` names the YAML file or option. Called before any model loads."""
    if config.push_to_hub and hub_offline():
        raise ConfigValueError(
            f"{where}: push_to_hub: true uploads the model to the Hugging Face Hub, but HF_HUB_OFFLINE is set "
            "(huggingface_hub is offline, every upload would fail): unset HF_HUB_OFFLINE (or set it to 0) on a "
            "machine that reaches the Hub, or set push_to_hub: false and upload output_dir later "
            "(hf upload REPO_ID OUTPUT_DIR --exclude 'checkpoint-*')", "push_to_hub")


def repo_name(config: Any) -> str:
    """The repository a run pushes to: ``hub_model_id``, or the name of ``output_dir`` (transformers' default)."""
    return config.hub_model_id or Path(config.output_dir).absolute().name


class HubPusher:
    """The uploads of one run (main process only): :meth:`create_repo` once, :meth:`push_checkpoint` at each save,
    :meth:`push_final` at the end (module documentation).

    Args:
        config: the run's :class:`gtpo.GTPOConfig` (``output_dir``, ``save_strategy`` and the ``hub_*`` fields).
    """

    def __init__(self, config: Any):
        self.config = config
        self.repo_id: str | None = None
        self.failures: list[str] = []  # what failed in the background, for the log at the end
        self._executor: ThreadPoolExecutor | None = None
        self._job: Future | None = None

    @property
    def _api(self):
        from huggingface_hub import HfApi

        return HfApi()

    def create_repo(self) -> str:
        """Create the repository if missing (``exist_ok``); returns its full id (``user/name``)."""
        c = self.config
        url = self._api.create_repo(repo_name(c), token=c.hub_token, private=c.hub_private_repo, exist_ok=True)
        self.repo_id = getattr(url, "repo_id", None) or repo_name(c)
        logger.info("pushing to the Hugging Face Hub repository %s (hub_strategy %s)", self.repo_id, c.hub_strategy)
        return self.repo_id

    # ------------------------------------------------------------------ checkpoints (background)
    def push_checkpoint(self, checkpoint_dir: str, *, step: int, epoch: int | None = None) -> bool:
        """Push ``checkpoint_dir`` (written at ``step``; ``epoch``: the epoch it ends with ``save_strategy: epoch``)
        in the background as ``hub_strategy`` says; returns whether a push was started (not with ``end``, nor while
        the previous one is uploading unless ``hub_always_push``)."""
        c = self.config
        if c.hub_strategy == "end" or self.repo_id is None:
            return False
        if self._job is not None and not self._job.done() and not c.hub_always_push:
            logger.warning("hub: the push of the previous checkpoint is still uploading; %s is not pushed "
                           "(hub_always_push: true pushes every checkpoint)", os.path.basename(checkpoint_dir))
            return False
        message = f"Training in progress, epoch {epoch}" if c.save_strategy == "epoch" and epoch is not None \
            else f"Training in progress, step {step}"
        stage = self._stage(checkpoint_dir, step)
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gtpo-hub")
        self._job = self._executor.submit(self._upload_checkpoint, stage, checkpoint_dir, message)
        return True

    def _stage(self, checkpoint_dir: str, step: int) -> str:
        """A directory of what this push uploads, made of hard links (copies where links fail) of the checkpoint's
        files, so that rotating the checkpoint away during the upload takes nothing from it: ``root/`` (the model
        files and the logs) and, for ``checkpoint`` / ``all_checkpoints``, ``checkpoint/`` (all its files)."""
        import fnmatch

        out = self.config.output_dir
        stage = os.path.join(out, f"{UPLOAD_PREFIX}{step}")
        shutil.rmtree(stage, ignore_errors=True)
        whole = self.config.hub_strategy in ("checkpoint", "all_checkpoints")
        for dirpath, _dirs, files in os.walk(checkpoint_dir):
            rel = os.path.relpath(dirpath, checkpoint_dir)
            for name in files:
                src = os.path.join(dirpath, name)
                targets = [os.path.join(stage, "checkpoint", rel)] if whole else []
                if not any(fnmatch.fnmatch(name, p) for p in NOT_MODEL_FILES):
                    targets.append(os.path.join(stage, "root", rel))
                for target in targets:
                    os.makedirs(target, exist_ok=True)
                    _link(src, os.path.join(target, name))
        os.makedirs(os.path.join(stage, "root"), exist_ok=True)
        for name in LOG_FILES:  # appended to while training: copied
            if os.path.isfile(os.path.join(out, name)):
                shutil.copyfile(os.path.join(out, name), os.path.join(stage, "root", name))
        return stage

    def _upload_checkpoint(self, stage: str, checkpoint_dir: str, message: str) -> None:
        c, name = self.config, os.path.basename(checkpoint_dir)
        try:
            self._api.upload_folder(repo_id=self.repo_id, folder_path=os.path.join(stage, "root"),
                                    commit_message=message, token=c.hub_token, revision=c.hub_revision)
            if c.hub_strategy in ("checkpoint", "all_checkpoints"):
                self._api.upload_folder(
                    repo_id=self.repo_id, folder_path=os.path.join(stage, "checkpoint"),
                    path_in_repo="last-checkpoint" if c.hub_strategy == "checkpoint" else name,
                    commit_message=message + ", checkpoint", token=c.hub_token, revision=c.hub_revision)
        except Exception as err:  # noqa: BLE001 -- training goes on; the checkpoint is saved locally
            what = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
            self.failures.append(f"{name}: {what}")
            logger.error("hub: pushing %s to %s FAILED (%s). The checkpoint is saved locally in %s and training "
                         "continues; the end of training pushes the final model again", name, self.repo_id, what,
                         checkpoint_dir)
        finally:
            shutil.rmtree(stage, ignore_errors=True)

    def wait(self) -> None:
        """Wait for the background push (if any) to finish."""
        if self._job is not None and not self._job.done():
            logger.info("hub: waiting for the push of the last checkpoint to finish")
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
        self._job = None

    # ------------------------------------------------------------------ the end (blocking)
    def push_final(self) -> None:
        """After the final model is saved: wait for the background push, then upload ``output_dir`` (but
        :data:`FINAL_IGNORE`) in one commit; :class:`HubUploadError` if it fails (the local files stay)."""
        c = self.config
        self.wait()
        if self.failures:
            logger.error("hub: %d checkpoint push(es) failed during training (%s); pushing the final model now",
                         len(self.failures), "; ".join(self.failures))
        try:
            self._api.upload_folder(repo_id=self.repo_id, folder_path=c.output_dir, commit_message=COMMIT_END,
                                    token=c.hub_token, revision=c.hub_revision, ignore_patterns=list(FINAL_IGNORE))
        except Exception as err:  # noqa: BLE001 -- named, with how to upload it by hand
            raise HubUploadError(
                f"push_to_hub: uploading the final model from {c.output_dir} to the Hub repository {self.repo_id} "
                f"failed: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}. The model is saved "
                f"locally in {c.output_dir}; upload it with: hf upload {self.repo_id} {c.output_dir} "
                "--exclude 'checkpoint-*' --exclude '.*'"
            ) from err
        logger.info("hub: pushed the final model to %s", self.repo_id)


def _link(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)
