"""Checkpoints of the calibration job: a job killed at any point resumes where it stopped, and
writes the same ``artifact.json``, byte for byte (``docs/calibration-resume.md``).

``OUT/checkpoint/`` holds one JSON file per unit of work, each written whole to a temporary name,
flushed to disk and renamed over the old one (a reader sees the old file or the new, never part):

* ``inputs.json``: what the results depend on (the model, both data sources' records, every
  setting, the versions of the code, torch and numpy). A job whose inputs differ is refused.
* ``tables.json``: the noise tables (and the other estimator's, measured to compare).
* ``mapping.json``: the accuracy points measured so far, each with its fit-sample counts.
* ``cut-K.json``: cut K's lossless pattern, then per level in order its pattern, QPART's as
  published, and the ladder's anchor (where the next level's search starts).
* ``coding.json``: the upload codings' ratios.

Each file holds ``{"sha256": …, "doc": …}``: the sha256 of the checkpoint's name, the inputs
record's digest and the document's canonical JSON (:func:`checkpoint_sha256`). A resumed job
refuses, in one line, a checkpoint whose digest does not match (edited by hand or by a tool that
does not recompute it, or copied from another job's folder). This is a seal against edits, not a
signature: whoever can write the folder can recompute the digest (ADR 0021).

The folder is removed once ``artifact.json`` is written.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

from qpart.offline.errors import CalibrationOutputError, CheckpointMismatchError
from qpart.profiles.artifacts import write_atomic

CHECKPOINT_DIR = "checkpoint"
INPUTS = "inputs"
_SHOWN_CHANGES = 6
_DIGEST_DOMAIN = b"qpart-checkpoint-v1\0"


def canonical_json(doc: Any) -> bytes:
    """``doc`` as JSON with sorted keys and no spaces: equal documents give equal bytes.

    The document is read back first, so it is sealed as it will be loaded: integer keys become
    strings (``{2: …, 10: …}`` sorts as ``"10", "2"``), tuples lists."""
    return json.dumps(json.loads(json.dumps(doc)), sort_keys=True, separators=(",", ":")).encode()


def inputs_sha256(inputs: Any) -> str:
    """sha256 hex of an inputs record's canonical JSON: what every checkpoint is bound to."""
    return hashlib.sha256(canonical_json(inputs)).hexdigest()


def checkpoint_sha256(name: str, bound_to: str, doc: Any) -> str:
    """sha256 hex of checkpoint ``name``'s document ``doc`` bound to the inputs digest ``bound_to``
    (``inputs.json`` is bound to its own document's digest).

    It detects an edit of the document, a checkpoint renamed (``cut-0.json`` to ``cut-4.json``) or
    copied from a job of other inputs. It does not stop a forger who recomputes it: the function
    is public and takes no secret (ADR 0021)."""
    hasher = hashlib.sha256(_DIGEST_DOMAIN)
    for part in (name.encode(), bound_to.encode(), canonical_json(doc)):
        hasher.update(len(part).to_bytes(8, "little"))
        hasher.update(part)
    return hasher.hexdigest()


def output_error(action: str, exc: OSError, checkpoints: Path | None = None) -> CalibrationOutputError:
    """A one-line error for an output that could not be written (a full disk, no permission)."""
    where = f" ({exc.filename})" if exc.filename else ""
    kept = (f"; the checkpoints in {checkpoints} are kept: fix that and run the same command again "
            "to resume" if checkpoints is not None else "; choose another --out or fix its permissions")
    return CalibrationOutputError(f"cannot {action}: {exc.strerror or exc}{where}{kept}")


def check_writable(out_dir: Path) -> None:
    """Refuse, writing nothing, an output folder that cannot be created or written: a file where a
    folder must be, or a folder without write permission (the job fails before it starts, not after
    its first stage).

    Raises:
        CalibrationOutputError: the first existing folder on the way is a file or is not writable.
    """
    existing = out_dir
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        err = OSError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(existing))
        raise output_error(f"create the output folder {out_dir}", err)
    if not os.access(existing, os.W_OK | os.X_OK):
        err = OSError(errno.EACCES, os.strerror(errno.EACCES), str(existing))
        raise output_error(f"create the output folder {out_dir}", err)


class Checkpoints:
    """The checkpoint folder of one job's output folder (see the module doc), for the inputs whose
    :func:`inputs_sha256` is ``bound_to``."""

    def __init__(self, folder: Path, bound_to: str) -> None:
        self.folder = folder
        self._bound_to = bound_to

    @classmethod
    def open(cls, out_dir: Path, inputs: dict[str, Any], *, fresh: bool = False) -> Checkpoints:
        """The checkpoints in ``out_dir`` for a job of ``inputs``: resumed if they were written for
        the same inputs, created if there are none, discarded first if ``fresh``.

        Raises:
            CheckpointMismatchError: checkpoints of other inputs are there (and not ``fresh``).
            CalibrationOutputError: ``out_dir`` cannot be created or written.
        """
        folder = out_dir / CHECKPOINT_DIR
        ck = cls(folder, inputs_sha256(inputs))
        try:
            if fresh and folder.exists():
                shutil.rmtree(folder)
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise output_error(f"create the output folder {out_dir}", exc) from exc
        saved = cls.refuse_other_inputs(out_dir, inputs)
        if saved is None:
            ck.save(INPUTS, json.loads(json.dumps(inputs)))  # the first write
        return ck

    @classmethod
    def refuse_other_inputs(cls, out_dir: Path, inputs: dict[str, Any]) -> Any:
        """The inputs saved in ``out_dir``'s checkpoints (None: none), reading only; raises
        :class:`CheckpointMismatchError` if they are not ``inputs``, or if any checkpoint's seal
        fails. The job asks this before its first long stage, and writes nothing until that stage
        has read every sample."""
        ck = cls(out_dir / CHECKPOINT_DIR, inputs_sha256(inputs))
        saved = ck.load(INPUTS) if ck.path(INPUTS).is_file() else None
        canonical = json.loads(json.dumps(inputs))
        if saved is not None and saved != canonical:
            changed = differences(saved, canonical)
            shown = ", ".join(changed[:_SHOWN_CHANGES]) + (", …" if len(changed) > _SHOWN_CHANGES else "")
            raise CheckpointMismatchError(
                f"{ck.folder} holds the checkpoints of a calibration with other inputs (changed: {shown}); "
                "run again with --fresh to discard them and start afresh, or choose another --out")
        if saved is not None:  # every seal checked now, not when its stage comes, minutes later
            for file in sorted(ck.folder.glob("*.json")):
                ck.load(file.stem)
        return saved

    def path(self, name: str) -> Path:
        """The file of checkpoint ``name``."""
        return self.folder / f"{name}.json"

    def load(self, name: str) -> Any:
        """Checkpoint ``name``'s document, or None when it was not written yet.

        Raises:
            CheckpointMismatchError: the file is not JSON or not a sealed checkpoint (not written by
                this job), or its digest does not match its content (edited since).
        """
        file = self.path(name)
        try:
            envelope = json.loads(file.read_bytes())
        except FileNotFoundError:
            return None
        except (ValueError, UnicodeDecodeError) as exc:
            raise CheckpointMismatchError(
                f"{file} is not a checkpoint this job wrote ({exc}); run again with --fresh to "
                "discard the checkpoints and start afresh") from exc
        except OSError as exc:
            raise output_error(f"read {file}", exc) from exc
        if not (isinstance(envelope, dict) and set(envelope) == {"sha256", "doc"}):
            raise CheckpointMismatchError(
                f"{file} is not a checkpoint this job wrote (no sha256 seal); run again with --fresh "
                "to discard the checkpoints and start afresh")
        doc = envelope["doc"]
        bound_to = inputs_sha256(doc) if name == INPUTS else self._bound_to
        if envelope["sha256"] != checkpoint_sha256(name, bound_to, doc):
            raise CheckpointMismatchError(
                f"{file} was changed after the job wrote it (its sha256 does not match its content "
                "and the job's inputs), so it cannot be trusted; run again with --fresh to discard "
                "the checkpoints and start afresh")
        return doc

    def save(self, name: str, doc: Any) -> None:
        """Write checkpoint ``name`` atomically, sealed with its :func:`checkpoint_sha256`.

        Raises:
            CalibrationOutputError: it could not be written (the previous one is still there).
        """
        bound_to = inputs_sha256(doc) if name == INPUTS else self._bound_to
        envelope = {"sha256": checkpoint_sha256(name, bound_to, doc), "doc": doc}
        try:
            write_atomic(self.path(name), json.dumps(envelope, indent=None, separators=(",", ":")) + "\n")
        except OSError as exc:
            raise output_error(f"write the checkpoint {self.path(name).name}", exc, self.folder) from exc

    def remove(self) -> None:
        """Remove the folder (the job is done: its results are in ``artifact.json``)."""
        shutil.rmtree(self.folder, ignore_errors=True)


def differences(old: Any, new: Any, prefix: str = "") -> list[str]:
    """Dotted names of the leaves that differ between two JSON documents."""
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for k in sorted(set(old) | set(new)):
            name = f"{prefix}.{k}" if prefix else str(k)
            if k not in old or k not in new:
                out.append(name)
            else:
                out += differences(old[k], new[k], name)
        return out
    return [] if old == new else [prefix or "the whole record"]
