"""Models on the Hugging Face Hub: a Hub repository id (``org/name``) wherever a model folder is accepted, and
folders ready to be pushed there (a model card beside ``config.json`` and ``model.safetensors``).

:func:`resolve_model` turns "a folder or a Hub id" into a local folder. A folder that exists always wins over a
Hub id of the same spelling; otherwise the id is fetched with ``huggingface_hub.snapshot_download`` into the
Hugging Face cache (``HF_HUB_CACHE`` or ``cache_dir``), at ``revision`` (a branch, tag or commit; default
``main``), with ``token`` (default: the one ``hf auth login`` stored, or ``HF_TOKEN``). With
``HF_HUB_OFFLINE=1``, huggingface_hub itself reads only the cache. Every failure (an unknown id or revision, no
network, a file missing from the cache) is one :class:`~latentloop.errors.UsageError` line that names the id
and the revision.

The snapshot folder is the repository as it was pushed, so a checkpoint folder (``config.json`` and
``model.safetensors``) and a whole run folder (``config.yaml``, ``checkpoints/step_*/``) both resolve as they do
on disk.
"""

from __future__ import annotations

import json
import re
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from huggingface_hub import HfApi, constants, snapshot_download
from huggingface_hub.utils import (
    GatedRepoError,
    HfHubHTTPError,
    HFValidationError,
    LocalEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

from latentloop.errors import UsageError
from latentloop.io import atomic_write_text

T = TypeVar("T")

CARD_FILE = "README.md"
# A Hub repository id as huggingface_hub accepts it, and always with its namespace: a bare word is far more
# often a mistyped folder than a legacy un-namespaced model.
_REPO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*")
_LICENSE = "apache-2.0"


def is_repo_id(text: str | Path) -> bool:
    """Whether ``text`` is spelled like a Hub model id ``org/name`` (whether or not such a repository exists)."""
    text = str(text)
    return (
        len(text) <= 96
        and _REPO_ID.fullmatch(text) is not None
        and ".." not in text
        and "--" not in text
        and not text.endswith((".", "-", ".git"))
    )


def from_hub(name_or_path: str | Path) -> bool:
    """Whether :func:`resolve_model` would fetch ``name_or_path`` from the Hub (no such local folder or file)."""
    return not Path(name_or_path).exists() and is_repo_id(name_or_path)


def describe(repo_id: str, revision: str | None) -> str:
    """``org/name`` or ``org/name@revision``, as error messages name a Hub model."""
    return f"{repo_id}@{revision}" if revision else repo_id


def resolve_model(
    name_or_path: str | Path,
    revision: str | None = None,
    cache_dir: str | Path | None = None,
    token: str | bool | None = None,
) -> Path:
    """The local folder of ``name_or_path``: itself when it exists, else the snapshot of the Hub repository it
    names (see the module docstring). Anything else is a one-line :class:`UsageError`."""
    path = Path(name_or_path)
    if path.exists():
        if revision is not None:
            raise UsageError(f"{path} is a local folder: a revision ({revision!r}) applies only to a Hub id")
        return path
    if not is_repo_id(name_or_path):
        raise UsageError(f"{path} does not exist")
    return _snapshot(str(name_or_path), revision, cache_dir, token)


def read_config_json(folder: Path, parse: Callable[[dict[str, Any]], T]) -> T:
    """``parse`` applied to ``folder/config.json``; a missing folder or file, JSON that is not an object, or a
    value ``parse`` refuses (``UsageError``, ``ValueError``, ``TypeError``) is one line naming the file."""
    file = folder / "config.json"
    if not folder.is_dir():
        raise UsageError(f"checkpoint folder {folder} does not exist")
    if not file.is_file():
        raise UsageError(f"{folder} has no config.json")
    try:
        data = json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise UsageError(f"{file} is not valid JSON: {error}") from None
    if not isinstance(data, dict):
        raise UsageError(f"{file} must hold a JSON object")
    try:
        return parse(data)
    except (UsageError, ValueError, TypeError) as error:
        raise UsageError(f"{file}: {error}") from None


def _cache_root(cache_dir: str | Path | None) -> Path:
    return Path(cache_dir) if cache_dir is not None else Path(constants.HF_HUB_CACHE)


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def _snapshot(
    repo_id: str, revision: str | None, cache_dir: str | Path | None, token: str | bool | None
) -> Path:
    name = describe(repo_id, revision)
    cache = _cache_root(cache_dir)
    try:
        folder = snapshot_download(repo_id, revision=revision, cache_dir=cache_dir, token=token)
    except RevisionNotFoundError:
        raise UsageError(f"Hub model {repo_id} has no revision {revision!r}") from None
    except GatedRepoError:
        raise UsageError(
            f"Hub model {repo_id} is gated: accept its terms on the Hub, then log in (hf auth login or HF_TOKEN)"
        ) from None
    except RepositoryNotFoundError:
        raise UsageError(
            f"{repo_id} is neither a local folder nor a model repository on the Hugging Face Hub (if it is "
            "private, log in with hf auth login or set HF_TOKEN)"
        ) from None
    except LocalEntryNotFoundError:
        # Offline, or the Hub could not be reached: only the cache was looked at.
        why = (
            "HF_HUB_OFFLINE is set"
            if constants.HF_HUB_OFFLINE
            else "the Hugging Face Hub could not be reached"
        )
        repo_folder = cache / f"models--{repo_id.replace('/', '--')}"
        if revision is not None and repo_folder.is_dir():
            raise UsageError(
                f"Hub model {repo_id} is in the cache {cache}, but not at revision {revision!r} ({why})"
            ) from None
        raise UsageError(
            f"{repo_id} is not a local folder, and Hub model {name} is not in the cache {cache} ({why})"
        ) from None
    except HFValidationError as error:
        raise UsageError(f"{repo_id!r} is not a valid Hub model id: {_first_line(error)}") from None
    except HfHubHTTPError as error:
        raise UsageError(f"Hub model {name}: the Hugging Face Hub answered: {_first_line(error)}") from None
    except Exception as error:  # connection, proxy, TLS and file-system errors, whose types vary by version
        raise UsageError(f"Hub model {name} could not be downloaded: {_first_line(error)}") from None
    return _check_snapshot(Path(folder), name)


def _check_snapshot(folder: Path, name: str) -> Path:
    """``folder`` when its files are all there. Offline, huggingface_hub returns a cached snapshot without
    looking inside it, so a file whose data (blob) was deleted, or a model that was never pushed, is caught
    here rather than reported later against the cache's inner paths."""
    for item in sorted(folder.rglob("*")):
        if item.is_symlink() and not item.exists():
            raise UsageError(
                f"Hub model {name}: the cached {item.relative_to(folder)} has lost its data; download it again "
                "(without HF_HUB_OFFLINE)"
            )
    if not (folder / "config.json").is_file() and not (folder / "config.yaml").is_file():
        raise UsageError(f"Hub model {name} holds no latentloop model (no config.json, no run config.yaml)")
    if (folder / "config.json").is_file() and not any(
        (folder / weights).is_file() for weights in ("model.safetensors", "model.safetensors.index.json")
    ):
        raise UsageError(f"Hub model {name} has a config.json but no model.safetensors")
    return folder


# Model cards ------------------------------------------------------------------------------------------------
def model_card(
    title: str,
    summary: str,
    sizes: Sequence[tuple[str, Any]],
    usage: str,
    tags: Sequence[str],
    pipeline_tag: str | None = None,
) -> str:
    """A Hub model card: YAML front matter (``library_name: latentloop``, ``tags``, ``license``), the title, a
    summary, a table of sizes and a usage section (Markdown)."""
    front = ["---", "library_name: latentloop", f"license: {_LICENSE}", "tags:"]
    front += [f"- {tag}" for tag in dict.fromkeys(("latentloop", *tags))]
    if pipeline_tag:
        front.append(f"pipeline_tag: {pipeline_tag}")
    table = ["| | |", "|---|---|", *(f"| {key} | {value} |" for key, value in sizes)]
    return "\n".join([*front, "---", "", f"# {title}", "", summary, "", *table, "", "## Use", "", usage, ""])


def lm_model_card(config: Any, parameters: int, repo_id: str | None = None) -> str:
    """The model card of a recurrent-depth LM (a :class:`~latentloop.models.recurrent_depth.RecurrentDepthConfig`
    and its parameter count); the usage names ``repo_id`` (default ``ORG/NAME``)."""
    c, where = config, repo_id or "ORG/NAME"
    layers = (c.n_layers_in_prelude, c.n_layers_in_recurrent_block, c.n_layers_in_coda)
    summary = (
        "A recurrent-depth language model (the Huginn architecture of Geiping et al. 2025) trained with "
        "latentloop: a prelude embeds the tokens, a core block is looped "
        "`num_steps` times on a latent state, and a coda decodes it, so test-time compute is chosen per call. "
        "`config.json` and `model.safetensors` follow the huginn-0125 layout (`model_type` `huginn_raven`)."
    )
    sizes = [
        ("layers (prelude, core, coda)", "({}, {}, {})".format(*layers)),
        ("width `n_embd`, heads", f"{c.n_embd}, {c.n_heads}"),
        ("MLP width `intermediate_size`", c.intermediate_size),
        ("vocabulary, context", f"{c.vocab_size}, {c.block_size}"),
        ("mean training depth `mean_recurrence`", c.mean_recurrence),
        ("parameters", f"{parameters:,}"),
    ]
    usage = (
        "```python\n"
        "from latentloop.models.recurrent_depth import RecurrentDepthLM\n\n"
        f'model = RecurrentDepthLM.from_pretrained("{where}")  # revision="main" by default\n'
        "logits = model(input_ids, num_steps=8, init_scale=0.0).logits\n"
        "```\n\n"
        "```bash\n"
        f'latentloop generate {where} "PROMPT" --num-steps {c.mean_recurrence}\n'
        f"latentloop eval {where} --task TASK --num-steps 1,4,16\n"
        "```"
    )
    return model_card(
        "Recurrent-depth language model",
        summary,
        sizes,
        usage,
        ("recurrent-depth", "huginn", "latent-reasoning"),
        pipeline_tag="text-generation",
    )


def reasoner_model_card(arch: str, config: Any, parameters: int, repo_id: str | None = None) -> str:
    """The model card of a puzzle reasoner ``arch`` (a :class:`~latentloop.models.reasoners.ReasonerConfig`
    and its parameter count); the usage names ``repo_id`` (default ``ORG/NAME``)."""
    c, where = config, repo_id or "ORG/NAME"
    summary = (
        f"A `{arch}` recursive reasoner for structured puzzles, trained with "
        "latentloop by deep supervision: each supervision step refines "
        "a latent state carried over from the last, so more steps (and, for stochastic models, more parallel "
        "samples) can be spent at test time. `config.json` (`model_type` "
        f"`reasoner-{arch}`) holds the sizes, `model.safetensors` the weights."
    )
    sizes = [
        ("model", f"`{arch}`"),
        ("width `dim`, heads", f"{c.dim}, {c.n_heads}"),
        ("blocks `n_layers`, MLP width `hidden`", f"{c.n_layers}, {c.hidden}"),
        ("layout `block`, `mixer`", f"{c.block}, {c.mixer}"),
        ("supervision steps `n_sup`, `cycles`, `inner`", f"{c.n_sup}, {c.cycles}, {c.inner}"),
        ("vocabulary, positions `seq_len`", f"{c.vocab_size}, {c.seq_len}"),
        ("parameters", f"{parameters:,}"),
    ]
    usage = (
        "```python\n"
        "from latentloop.models.reasoners import load_reasoner\n\n"
        f'model = load_reasoner("{where}")  # revision="main" by default\n'
        "```\n\n"
        "```bash\n"
        f"latentloop solve TASK PUZZLE --model {where}  # TASK with the options it was trained on\n"
        "```"
    )
    return model_card(
        f"`{arch}` puzzle reasoner", summary, sizes, usage, ("recursive-reasoning", arch, "latent-reasoning")
    )


def write_model_card(folder: str | Path, text: str) -> None:
    """Write ``text`` as ``README.md`` of ``folder``, atomically."""
    atomic_write_text(Path(folder) / CARD_FILE, text)


class PushToHub:
    """``push_to_hub`` for a model class with ``save_pretrained(folder)`` and ``model_card(repo_id)``."""

    def push_to_hub(
        self,
        repo_id: str,
        *,
        private: bool | None = None,
        token: str | bool | None = None,
        revision: str | None = None,
        commit_message: str | None = None,
    ) -> str:
        """Upload :meth:`save_pretrained`'s folder to Hub repository ``repo_id`` (created when missing);
        returns the commit's URL."""
        return push_folder(
            self.save_pretrained,  # type: ignore[attr-defined]
            self.model_card,  # type: ignore[attr-defined]
            repo_id,
            private=private,
            token=token,
            revision=revision,
            commit_message=commit_message,
        )


def push_folder(
    save: Callable[[Path], None],
    card: Callable[[str], str],
    repo_id: str,
    *,
    private: bool | None = None,
    token: str | bool | None = None,
    revision: str | None = None,
    commit_message: str | None = None,
) -> str:
    """Upload what ``save(folder)`` writes, with the model card ``card(repo_id)``, to Hub repository
    ``repo_id`` (created when missing) with ``huggingface_hub``'s ``upload_folder``; returns the commit's URL."""
    if not is_repo_id(repo_id):
        raise UsageError(f"{repo_id!r} is not a Hub model id of the form org/name")

    with tempfile.TemporaryDirectory(prefix="latentloop-push-") as temp:
        folder = Path(temp) / "model"
        save(folder)
        write_model_card(folder, card(repo_id))
        try:
            api = HfApi(token=token)
            api.create_repo(repo_id, private=private, exist_ok=True)
            info = api.upload_folder(
                repo_id=repo_id,
                folder_path=folder,
                revision=revision,
                commit_message=commit_message or "Upload latentloop model",
            )
        except Exception as error:  # HTTP, authentication and connection errors, whose types vary by version
            raise UsageError(
                f"pushing to Hub model {describe(repo_id, revision)} failed: {_first_line(error)}"
            ) from None
    return str(getattr(info, "commit_url", info))
